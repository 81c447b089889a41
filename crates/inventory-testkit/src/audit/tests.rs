use super::*;

#[test]
fn a_mismatch_names_the_sku_and_both_sides() {
    let mismatch = LevelMismatch {
        sku: "S-1".into(),
        on_hand: 10,
        reserved: 3,
        held: 2,
    };
    assert_eq!(
        mismatch.to_string(),
        "S-1: reserved 3, held rows 2, on_hand 10"
    );
}
