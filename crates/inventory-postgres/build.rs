//! The migrations are embedded at compile time (`refinery::embed_migrations!`), which cargo
//! cannot see: a new or changed file in `migrations/` must rebuild this crate.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
