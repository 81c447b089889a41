//! The layout lint: every module a crate's `lib.rs` declares (`mod x;`, `pub mod x;`) is named
//! in the `# Layout` section of that file's crate documentation, so the map a reader opens
//! first lists every module there is. Covers the server crate (`src/lib.rs`) and every crate
//! under `crates/`.

use std::path::{Path, PathBuf};

/// The workspace root: this crate lives in `crates/inventory-testkit`.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/inventory-testkit sits two folders below the workspace root")
        .to_path_buf()
}

/// `(crate name, lib.rs)` of every library crate in the workspace.
fn libraries(root: &Path) -> Vec<(String, PathBuf)> {
    let mut crates = vec![root.to_path_buf()];
    let mut members: Vec<_> = std::fs::read_dir(root.join("crates"))
        .expect("read crates/")
        .map(|entry| entry.expect("read crates/").path())
        .collect();
    members.sort();
    crates.extend(members);
    crates
        .into_iter()
        .filter(|dir| dir.join("src/lib.rs").is_file())
        .map(|dir| (package_name(&dir), dir.join("src/lib.rs")))
        .collect()
}

/// The `name` of the `[package]` in `dir/Cargo.toml`.
fn package_name(dir: &Path) -> String {
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).expect("read Cargo.toml");
    let mut in_package = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package && let Some(value) = line.strip_prefix("name") {
            let value = value.trim_start();
            if let Some(value) = value.strip_prefix('=') {
                return value.trim().trim_matches('"').to_owned();
            }
        }
    }
    panic!("no [package] name in {}", dir.join("Cargo.toml").display())
}

/// The modules `source` declares at its top level as files (`mod x;`, `pub mod x;`,
/// `pub(crate) mod x;`), leaving out `#[cfg(test)]` ones.
fn declared_modules(source: &str) -> Vec<String> {
    let mut modules = Vec::new();
    let mut test_only = false;
    for line in source.lines() {
        if line.starts_with("#[cfg(test)]") {
            test_only = true;
            continue;
        }
        let declared = without_visibility(line)
            .strip_prefix("mod ")
            .and_then(|rest| rest.trim_end().strip_suffix(';'))
            .map(str::trim);
        if let Some(name) = declared
            && !test_only
        {
            modules.push(name.to_owned());
        }
        if !line.starts_with("#[") && !line.trim().is_empty() {
            test_only = false;
        }
    }
    modules
}

/// `line` without a leading `pub` or `pub(...)`.
fn without_visibility(line: &str) -> &str {
    let Some(rest) = line.strip_prefix("pub") else {
        return line;
    };
    let rest = match rest.strip_prefix('(') {
        Some(scoped) => scoped.split_once(')').map_or(scoped, |(_, rest)| rest),
        None => rest,
    };
    rest.trim_start()
}

/// The `# Layout` section of the crate documentation (`//!` lines) up to the next heading, or
/// `None` when there is none.
fn layout_section(source: &str) -> Option<String> {
    let docs: Vec<&str> = source
        .lines()
        .map_while(|line| line.strip_prefix("//!"))
        .map(str::trim)
        .collect();
    let start = docs.iter().position(|line| *line == "# Layout")?;
    let section: Vec<&str> = docs[start + 1..]
        .iter()
        .take_while(|line| !line.starts_with('#'))
        .copied()
        .collect();
    Some(section.join("\n"))
}

/// The names a section mentions in code spans (`` `x` ``, `` [`x`] ``, `` `x::y` `` names `x`).
fn named_modules(section: &str) -> Vec<String> {
    section
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|span| span.split("::").next().unwrap_or(span).to_owned())
        .collect()
}

/// What is wrong with one crate's `lib.rs`: each declared module its `# Layout` leaves out.
fn problems(name: &str, lib: &Path, source: &str) -> Vec<String> {
    let modules = declared_modules(source);
    if modules.is_empty() {
        return Vec::new();
    }
    let Some(section) = layout_section(source) else {
        return vec![format!(
            "{name}: {} has no `# Layout` section naming its modules ({})",
            lib.display(),
            modules.join(", ")
        )];
    };
    let named = named_modules(&section);
    modules
        .into_iter()
        .filter(|module| !named.contains(module))
        .map(|module| {
            format!(
                "{name}: module `{module}` is not named in the `# Layout` section of {}",
                lib.display()
            )
        })
        .collect()
}

#[test]
fn every_module_a_crate_declares_is_named_in_its_layout_section() {
    let root = workspace_root();
    let libraries = libraries(&root);
    assert!(
        libraries.iter().any(|(name, _)| name == "inventory-server"),
        "the server crate's src/lib.rs was not found under {}",
        root.display()
    );
    let mut found = Vec::new();
    for (name, lib) in &libraries {
        let source = std::fs::read_to_string(lib).expect("read lib.rs");
        let relative = lib.strip_prefix(&root).unwrap_or(lib);
        found.extend(problems(name, relative, &source));
    }
    assert!(
        found.is_empty(),
        "modules missing from `# Layout`:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_lint_reads_declarations_and_sections_as_written() {
    let source = "//! A crate.\n\
                  //!\n\
                  //! # Layout\n\
                  //! - [`alpha`] — the first.\n\
                  //! - `beta`, `gamma::Thing` — the rest.\n\
                  //!\n\
                  //! # Other\n\
                  //! - `delta` is named outside the section.\n\
                  \n\
                  pub mod alpha;\n\
                  mod beta;\n\
                  pub(crate) mod gamma;\n\
                  pub mod delta;\n\
                  pub mod inline {\n\
                  }\n\
                  #[cfg(test)]\n\
                  mod tests;\n";
    assert_eq!(
        declared_modules(source),
        ["alpha", "beta", "gamma", "delta"]
    );
    assert_eq!(
        problems("demo", Path::new("src/lib.rs"), source),
        ["demo: module `delta` is not named in the `# Layout` section of src/lib.rs"]
    );
    assert_eq!(
        problems("demo", Path::new("src/lib.rs"), "mod alpha;\n"),
        ["demo: src/lib.rs has no `# Layout` section naming its modules (alpha)"]
    );
}
