//! `inventory-model`: the hand-written mutants for `make model-mutants`.
//!
//! - `inventory-model mutants` lists their names, one a line;
//! - `inventory-model mutate ROOT NAME` writes mutant NAME into the tree at ROOT (which must
//!   be a scratch copy: the file is changed in place);
//! - `inventory-model describe NAME` prints what the mutant breaks;
//! - `inventory-model file NAME` prints the file it changes (to restore it after).

use std::{path::Path, process::ExitCode};

use inventory_model::mutants::{Mutant, parse};

fn mutants() -> Result<Vec<Mutant>, String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("mutants.txt");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&text)
}

fn named(name: &str) -> Result<Mutant, String> {
    mutants()?
        .into_iter()
        .find(|m| m.name == name)
        .ok_or_else(|| format!("no mutant `{name}`"))
}

fn run(args: &[String]) -> Result<(), String> {
    match args {
        [command] if command == "mutants" => {
            for m in mutants()? {
                println!("{}", m.name);
            }
            Ok(())
        }
        [command, name] if command == "describe" => {
            let m = named(name)?;
            println!("{} ({}): {}", m.name, m.file, m.what);
            Ok(())
        }
        [command, name] if command == "file" => {
            println!("{}", named(name)?.file);
            Ok(())
        }
        [command, root, name] if command == "mutate" => {
            let m = named(name)?;
            let path = Path::new(root).join(&m.file);
            let text =
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            std::fs::write(&path, m.apply(&text)?).map_err(|e| format!("{}: {e}", path.display()))
        }
        _ => Err(
            "usage: inventory-model mutants | describe NAME | file NAME | mutate ROOT NAME".into(),
        ),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("inventory-model: {message}");
            ExitCode::from(2)
        }
    }
}
