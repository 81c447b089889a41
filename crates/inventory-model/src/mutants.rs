//! Hand-written mutants: small deliberate defects in the server's rules and SQL, each an
//! exact text replacement in one file (`mutants.txt` beside this crate's manifest). `make
//! model-mutants` applies them one at a time in a scratch copy of the tree and runs the
//! model's short profile against each: a mutant the model catches is one more defect of its
//! kind the model would find.

/// One mutant: where, what, and what a merchant would notice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mutant {
    pub name: String,
    pub what: String,
    pub file: String,
    pub find: String,
    pub replace: String,
}

impl Mutant {
    /// The file's text with the defect in, or why it cannot be applied (the text to find is
    /// missing or not unique: the code moved since the mutant was written).
    pub fn apply(&self, text: &str) -> Result<String, String> {
        match text.matches(&self.find).count() {
            1 => Ok(text.replacen(&self.find, &self.replace, 1)),
            n => Err(format!(
                "mutant {}: its text occurs {n} times in {} (once expected)",
                self.name, self.file
            )),
        }
    }
}

/// The mutants of `text` (the format `mutants.txt` explains at its top).
pub fn parse(text: &str) -> Result<Vec<Mutant>, String> {
    let mut mutants = Vec::new();
    let mut current: Option<Mutant> = None;
    // Which multi-line field a `| ` line continues.
    let mut field = "";
    for (number, line) in text.lines().enumerate() {
        let at = |message: &str| format!("mutants.txt line {}: {message}", number + 1);
        if let Some(header) = line.strip_prefix("## ") {
            if let Some(done) = current.take() {
                mutants.push(done);
            }
            let (name, what) = header
                .split_once(':')
                .ok_or_else(|| at("`## name: what`"))?;
            current = Some(Mutant {
                name: name.trim().to_owned(),
                what: what.trim().to_owned(),
                file: String::new(),
                find: String::new(),
                replace: String::new(),
            });
            field = "";
            continue;
        }
        let Some(mutant) = current.as_mut() else {
            continue;
        };
        if let Some(file) = line.strip_prefix("file: ") {
            mutant.file = file.trim().to_owned();
        } else if let Some(find) = line.strip_prefix("find: ") {
            mutant.find = find.to_owned();
            field = "find";
        } else if let Some(replace) = line.strip_prefix("replace: ") {
            mutant.replace = replace.to_owned();
            field = "replace";
        } else if let Some(more) =
            line.strip_prefix("| ")
                .or(if line == "|" { Some("") } else { None })
        {
            let target = match field {
                "find" => &mut mutant.find,
                "replace" => &mut mutant.replace,
                _ => return Err(at("a `| ` line outside find or replace")),
            };
            target.push('\n');
            target.push_str(more);
        } else if !line.trim().is_empty() && !line.starts_with('#') {
            return Err(at("expected `file:`, `find:`, `replace:` or `| `"));
        }
    }
    mutants.extend(current);
    for m in &mutants {
        if m.file.is_empty() || m.find.is_empty() {
            return Err(format!(
                "mutant {}: needs a file and a text to find",
                m.name
            ));
        }
    }
    Ok(mutants)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn parses_blocks_with_continued_lines() {
        let text = "# comment\n\n## off-by-one: one unit too many\nfile: a.rs\nfind: let x = 1;\n| let y = 2;\nreplace: let x = 2;\n| let y = 2;\n\n## two: other\nfile: b.rs\nfind: a\nreplace: b\n";
        let mutants = parse(text).unwrap();
        assert_eq!(mutants.len(), 2);
        assert_eq!(mutants[0].find, "let x = 1;\nlet y = 2;");
        assert_eq!(mutants[0].replace, "let x = 2;\nlet y = 2;");
        assert_eq!(mutants[1].what, "other");
        assert_eq!(
            mutants[0]
                .apply("fn f() { let x = 1;\nlet y = 2; }")
                .unwrap(),
            "fn f() { let x = 2;\nlet y = 2; }"
        );
        assert!(mutants[1].apply("a a").is_err());
    }

    /// Every mutant the project lists still applies to today's code (once, exactly).
    #[test]
    fn every_listed_mutant_applies_to_the_tree() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(root.join("mutants.txt")).unwrap();
        let workspace = root.ancestors().nth(2).unwrap();
        let mutants = parse(&text).unwrap();
        assert!(mutants.len() >= 10, "{} mutants", mutants.len());
        for mutant in mutants {
            let source = std::fs::read_to_string(workspace.join(&mutant.file))
                .unwrap_or_else(|e| panic!("{}: {e}", mutant.file));
            mutant.apply(&source).unwrap();
        }
    }
}
