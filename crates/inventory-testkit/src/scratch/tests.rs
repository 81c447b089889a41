use super::*;

#[test]
fn a_scratch_folder_is_removed_on_drop() {
    let scratch = Scratch::new("scratch-test");
    let file = scratch.write("a.txt", "hello");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "hello");
    let path = scratch.0.clone();
    drop(scratch);
    assert!(!path.exists());
}
