//! Output: colour only on a terminal (and never with `NO_COLOR`), aligned tables, JSON,
//! ages and sizes written for people.

use std::io::IsTerminal;
use std::time::Duration;

use comfy_table::{Table, presets};
use console::Style;
use serde_json::Value;

/// How to write for whoever reads stdout.
#[derive(Clone, Copy, Debug)]
pub struct Out {
    /// One JSON document instead of text.
    pub json: bool,
    colour: bool,
}

impl Out {
    /// Colour when stdout is a terminal and `NO_COLOR` is unset or empty.
    pub fn new(json: bool) -> Out {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Out {
            json,
            colour: !json && !no_color && std::io::stdout().is_terminal(),
        }
    }

    /// A status word coloured by its meaning (green ok, yellow partial, red bad).
    pub fn status(&self, word: &str) -> String {
        let style = match word.to_ascii_uppercase().as_str() {
            "UP" | "OK" | "DECLARED" | "SAME" | "REPLAYED" | "PURGED" => Style::new().green(),
            "DEGRADED" | "DRIFT" | "MISSING" | "NOT CHECKED" | "PARTIAL" | "WOULD REPLAY" => {
                Style::new().yellow()
            }
            "DOWN" | "ERROR" | "FAILED" | "UNREACHABLE" => Style::new().red().bold(),
            _ => Style::new(),
        };
        style.force_styling(self.colour).apply_to(word).to_string()
    }

    /// Dimmed text (notes, hints).
    pub fn dim(&self, text: &str) -> String {
        Style::new()
            .dim()
            .force_styling(self.colour)
            .apply_to(text)
            .to_string()
    }

    /// Bold text (headings).
    pub fn bold(&self, text: &str) -> String {
        Style::new()
            .bold()
            .force_styling(self.colour)
            .apply_to(text)
            .to_string()
    }

    /// Prints one JSON document, pretty.
    pub fn print_json(&self, value: &Value) {
        println!(
            "{}",
            serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
        );
    }
}

/// A borderless table with this header, aligned like `kubectl get`.
pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING);
    t.set_header(header.iter().copied());
    t
}

/// Prints a table without the leading space the borderless preset leaves.
pub fn print_table(t: &Table) {
    for line in t.lines() {
        println!("{}", line.strip_prefix(' ').unwrap_or(&line).trim_end());
    }
}

/// `45s`, `12m 3s`, `3h 5m`, `2d 4h`, `1d`: two units at most, a zero second unit left out.
pub fn age(d: Duration) -> String {
    let s = d.as_secs();
    let (big, big_unit, small, small_unit) = match s {
        0..60 => return format!("{s}s"),
        60..3_600 => (s / 60, "m", s % 60, "s"),
        3_600..86_400 => (s / 3_600, "h", (s % 3_600) / 60, "m"),
        _ => (s / 86_400, "d", (s % 86_400) / 3_600, "h"),
    };
    if small == 0 {
        format!("{big}{big_unit}")
    } else {
        format!("{big}{big_unit} {small}{small_unit}")
    }
}

/// Cuts `text` to `max` characters, with an ellipsis when cut, on one line.
pub fn cut(text: &str, max: usize) -> String {
    let one_line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if one_line.chars().count() <= max {
        one_line
    } else {
        let mut s: String = one_line.chars().take(max.saturating_sub(1)).collect();
        s.push('…');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_and_cuts_read_well() {
        assert_eq!(age(Duration::from_secs(59)), "59s");
        assert_eq!(age(Duration::from_secs(723)), "12m 3s");
        assert_eq!(age(Duration::from_secs(3 * 86_400 + 7_300)), "3d 2h");
        assert_eq!(age(Duration::from_secs(86_400)), "1d");
        assert_eq!(cut("abc\ndef", 10), "abc def");
        assert_eq!(cut("abcdef", 4), "abc…");
    }
}
