//! Scratch folders.

use std::path::PathBuf;

/// A scratch folder under the system's temporary folder, removed on drop.
#[derive(Debug)]
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// A new, empty folder named `inventory-<kind>-<random>`. Panics when it cannot be made:
    /// a harness with no temporary folder cannot run anything.
    pub fn new(kind: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "inventory-{kind}-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|error| panic!("create {}: {error}", path.display()));
        Self(path)
    }

    /// Writes `name` in the folder; returns its path.
    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, contents)
            .unwrap_or_else(|error| panic!("write {}: {error}", path.display()));
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests;
