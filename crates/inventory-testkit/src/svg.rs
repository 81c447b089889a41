//! The pieces the SVG charts of the benchmark and the fault suite share: the document, line
//! series, labels. Written by hand: a chart is a few dozen elements.

use std::fmt::Write as _;

/// Opens a document of `width` × `height` on a white background.
pub fn open(out: &mut String, width: f64, height: f64, font_size: u32) {
    let _ = write!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="{font_size}"><rect width="100%" height="100%" fill="white"/>"##
    );
}

/// Closes the document [`open`] began.
pub fn close(out: &mut String) {
    out.push_str("</svg>\n");
}

/// Text made safe for an element's content or an attribute.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A line through `points` (already in the chart's coordinates).
pub fn polyline(
    out: &mut String,
    colour: &str,
    stroke_width: f64,
    points: impl IntoIterator<Item = (f64, f64)>,
) {
    let points: Vec<String> = points
        .into_iter()
        .map(|(x, y)| format!("{x:.1},{y:.1}"))
        .collect();
    let _ = write!(
        out,
        r##"<polyline fill="none" stroke="{colour}" stroke-width="{stroke_width}" points="{}"/>"##,
        points.join(" ")
    );
}

/// An axis label for `v`: no decimals from 100 up, one from 1, two below.
pub fn tick(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests;
