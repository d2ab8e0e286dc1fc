//! How lbctl prints: `-o table|wide|json|yaml`, the table printer, times as "ago".

use clap::ValueEnum;
use comfy_table::{Table, presets::NOTHING};
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned columns, the most useful ones.
    Table,
    /// Every column.
    Wide,
    /// The API's JSON (docs/api.md), pretty-printed.
    Json,
    /// The same document as YAML.
    Yaml,
}

impl Output {
    /// A machine-readable format: no terminal codes, no decoration.
    pub fn structured(self) -> bool {
        matches!(self, Output::Json | Output::Yaml)
    }
    pub fn wide(self) -> bool {
        self == Output::Wide
    }
}

/// Print `v` as JSON or YAML (`out` must be structured).
pub fn document<T: Serialize>(out: Output, v: &T) -> anyhow::Result<()> {
    let text = match out {
        Output::Yaml => serde_norway::to_string(v)?,
        _ => serde_json::to_string_pretty(v)? + "\n",
    };
    print!("{text}");
    Ok(())
}

/// Rows as aligned columns without borders (like kubectl's), two spaces apart.
pub fn table(headers: &[&str], rows: Vec<Vec<String>>) {
    print!("{}", table_text(headers, rows));
}

pub fn table_text(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut t = Table::new();
    t.load_style(NOTHING);
    t.set_header(headers.iter().copied());
    for r in rows {
        t.add_row(r);
    }
    for c in t.column_iter_mut() {
        c.set_padding((0, 2));
    }
    let mut out = String::new();
    for line in t.lines() {
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A VIP's address (as shown) followed by its config name, if it has one: `10.0.0.1:80 (web)`.
pub fn with_name(shown: String, name: &Option<String>) -> String {
    match name {
        Some(n) => format!("{shown} ({n})"),
        None => shown,
    }
}

/// An optional value, `-` when absent.
pub fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref()
        .map(|x| x.to_string())
        .unwrap_or_else(|| "-".into())
}

/// A past instant (unix ms) as "3.2s ago", "4m12s ago", "2h03m ago"; "-" when absent.
pub fn ago(unix_ms: Option<u64>) -> String {
    let Some(t) = unix_ms else {
        return "-".into();
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let ms = now.saturating_sub(t);
    match ms {
        0..=59_999 => format!("{:.1}s ago", ms as f64 / 1000.0),
        60_000..=3_599_999 => format!("{}m{:02}s ago", ms / 60_000, ms / 1000 % 60),
        3_600_000..=172_799_999 => format!("{}h{:02}m ago", ms / 3_600_000, ms / 60_000 % 60),
        _ => format!("{}d ago", ms / 86_400_000),
    }
}

/// A duration like 500ms, 5s, 2m or 1m30s (humantime's syntax), or plain seconds; above 0 and
/// below a day.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let d = match s.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs >= 0.0 => std::time::Duration::from_secs_f64(secs),
        _ => humantime::parse_duration(s)
            .map_err(|e| format!("{s:?}: {e} (want a duration like 500ms, 5s or 1m)"))?,
    };
    if d.is_zero() || d >= std::time::Duration::from_secs(86_400) {
        return Err(format!("{s:?}: must be above 0 and below a day"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_ago() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert_eq!(ago(Some(now - 3_200)), "3.2s ago");
        assert_eq!(ago(Some(now - 252_000)), "4m12s ago");
        assert_eq!(ago(Some(now - 7_380_000)), "2h03m ago");
        assert_eq!(ago(None), "-");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap().as_millis(), 500);
        assert_eq!(parse_duration("5s").unwrap().as_secs(), 5);
        assert_eq!(parse_duration("2").unwrap().as_secs(), 2);
        assert_eq!(parse_duration("1m30s").unwrap().as_secs(), 90);
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("25h").is_err(), "a day or more");
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn tables_align_without_borders() {
        let t = table_text(
            &["NAME", "VIP"],
            vec![
                vec!["api".into(), "10.0.0.1".into()],
                vec!["ingress-long".into(), "x".into()],
            ],
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "NAME          VIP");
        assert_eq!(lines[1], "api           10.0.0.1");
        assert_eq!(lines[2], "ingress-long  x");
    }
}
