//! The migrations are embedded at compile time (`refinery::embed_migrations!`), which cargo
//! cannot see: a new or changed file in `migrations/` must rebuild this crate.
//!
//! It also reads every migration's floor, the schema compatibility contract (see
//! docs/design.md, "Changing the schema"): each migration from
//! [`FIRST_DECLARED`] on starts with a line `-- floor: N`, the oldest release (a release is
//! known by the newest migration it carries) that may still write once the migration is
//! applied. The build fails on a migration without one, on a floor above the migration's own
//! version, and on a floor below the one before it; so `make lint` and every build check it.
//! The floors go to `$OUT_DIR/floors.rs` for `migrate.rs`.

use std::{fs, path::Path};

/// The first migration written under the contract. The ones before it were not held to
/// keeping the previous release writing, so each counts as raising the floor to itself.
/// (Their files cannot gain a line: refinery checksums applied migrations.)
const FIRST_DECLARED: i32 = 14;

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    let mut migrations: Vec<(i32, String)> = fs::read_dir("migrations")
        .expect("the migrations folder")
        .map(|entry| entry.expect("a migration file").path())
        .filter(|path| path.extension().is_some_and(|e| e == "sql"))
        .map(|path| (version_of(&path), path.display().to_string()))
        .collect();
    migrations.sort();

    let mut floors = Vec::new();
    let mut previous = 0;
    for (version, path) in &migrations {
        let floor = if *version < FIRST_DECLARED {
            *version
        } else {
            declared_floor(path, *version)
        };
        if floor < previous {
            fail(&format!(
                "{path}: floor {floor} is below {previous}, the floor before it (a floor never \
                 goes down: a release the schema once refused stays refused)"
            ));
        }
        previous = floor;
        floors.push(format!("({version}, {floor})"));
    }
    let out = Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("floors.rs");
    fs::write(
        out,
        format!(
            "/// `(migration, floor)`, every embedded migration in order.\n\
             pub(crate) const FLOORS: &[(i32, i32)] = &[{}];\n\
             /// The newest migration embedded: this binary's release.\n\
             pub const RELEASE: i32 = {};\n",
            floors.join(", "),
            migrations.last().map_or(0, |(version, _)| *version)
        ),
    )
    .expect("floors.rs written");
}

fn version_of(path: &Path) -> i32 {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    name.strip_prefix('V')
        .and_then(|rest| rest.split_once("__"))
        .and_then(|(version, _)| version.parse().ok())
        .unwrap_or_else(|| fail(&format!("{name}: not named V<version>__<name>.sql")))
}

/// The `N` of the first line `-- floor: N` (text may follow it after a space).
fn declared_floor(path: &str, version: i32) -> i32 {
    let sql = fs::read_to_string(path).expect("a readable migration");
    let Some(line) = sql.lines().find_map(|l| l.trim().strip_prefix("-- floor:")) else {
        fail(&format!(
            "{path}: declares no floor. Start it with `-- floor: N`: the oldest release that \
             may still write once it is applied ({previous} or more: an additive migration \
             keeps the previous release's floor; one the previous release would corrupt \
             raises it to {version})",
            previous = version - 1
        ))
    };
    let floor: i32 = line
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| fail(&format!("{path}: `-- floor:` is not followed by a number")));
    if !(1..=version).contains(&floor) {
        fail(&format!(
            "{path}: floor {floor} must be between 1 and the migration's own version {version}"
        ));
    }
    floor
}

fn fail(message: &str) -> ! {
    panic!("\n\nschema compatibility contract: {message}\n\n");
}
