use super::*;

#[test]
fn a_document_is_opened_on_white_and_closed() {
    let mut out = String::new();
    open(&mut out, 900.0, 400.5, 12);
    close(&mut out);
    assert_eq!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"900\" height=\"400.5\" \
         font-family=\"sans-serif\" font-size=\"12\"><rect width=\"100%\" height=\"100%\" \
         fill=\"white\"/></svg>\n"
    );
}

#[test]
fn a_polyline_rounds_to_a_tenth() {
    let mut out = String::new();
    polyline(&mut out, "#123456", 1.5, [(1.0, 2.04), (3.26, 4.0)]);
    assert_eq!(
        out,
        "<polyline fill=\"none\" stroke=\"#123456\" stroke-width=\"1.5\" points=\"1.0,2.0 3.3,4.0\"/>"
    );
}

#[test]
fn text_is_escaped() {
    assert_eq!(escape("a<b & \"c\">"), "a&lt;b &amp; &quot;c&quot;&gt;");
}

#[test]
fn ticks_keep_two_significant_places_at_most() {
    assert_eq!(tick(1234.6), "1235");
    assert_eq!(tick(12.34), "12.3");
    assert_eq!(tick(0.1234), "0.12");
}
