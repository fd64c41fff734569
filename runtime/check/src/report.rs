//! A run's report: a row per scenario and a column per runtime, then the bench's timings; as
//! text for people, JSON for programs and JUnit XML for CI.

use std::fmt::Write as _;

use serde_json::{Map, Value, json};

use crate::bench::{Bench, OPERATIONS};
use crate::outcome::Outcome;

/// One runtime's column.
#[derive(Debug, Clone)]
pub struct Column {
    pub endpoint: String,
    /// Its name and version, from `Version`.
    pub runtime: String,
    pub bench: Option<Bench>,
    /// Why no scenario could run on it.
    pub setup_error: Option<String>,
}

/// One scenario's row: its outcome on each column, in order.
#[derive(Debug, Clone)]
pub struct Row {
    pub name: &'static str,
    pub results: Vec<Outcome>,
}

/// What a run found.
#[derive(Debug, Clone)]
pub struct Report {
    pub run_id: String,
    pub columns: Vec<Column>,
    pub rows: Vec<Row>,
    /// The run was stopped before its end.
    pub interrupted: bool,
}

impl Report {
    /// Whether every runtime passed every scenario it ran, and the run was not cut short.
    pub fn passed(&self) -> bool {
        !self.interrupted
            && self
                .rows
                .iter()
                .all(|r| r.results.iter().all(|o| !matches!(o, Outcome::Fail(_))))
    }

    /// `op`'s median on `column` divided by the first column's.
    fn ratio(&self, column: usize, op: &str) -> Option<f64> {
        let first = self.columns.first()?.bench.as_ref()?.stats(op)?.0;
        let this = self.columns.get(column)?.bench.as_ref()?.stats(op)?.0;
        (!first.is_zero()).then(|| this.as_secs_f64() / first.as_secs_f64())
    }

    /// The JSON report: `{"endpoints": [...], "scenarios": [{"name", "results": {<endpoint>:
    /// {"status", "message"}}}], "bench": {<endpoint>: {<operation>: {"median_ms", "p90_ms",
    /// "ratio"}}}}`, with the runtimes' names, the memory measured and the run id beside.
    pub fn to_json(&self) -> Value {
        let endpoints: Vec<&str> = self.columns.iter().map(|c| c.endpoint.as_str()).collect();
        let scenarios: Vec<Value> = self
            .rows
            .iter()
            .map(|row| {
                let mut results = Map::new();
                for (col, outcome) in self.columns.iter().zip(&row.results) {
                    results.insert(
                        col.endpoint.clone(),
                        json!({"status": outcome.status(), "message": outcome.message()}),
                    );
                }
                json!({"name": row.name, "results": results})
            })
            .collect();
        let mut bench = Map::new();
        let mut memory = Map::new();
        let mut runtimes = Map::new();
        for (i, col) in self.columns.iter().enumerate() {
            runtimes.insert(col.endpoint.clone(), json!(col.runtime));
            let Some(b) = &col.bench else { continue };
            let mut ops = Map::new();
            for op in OPERATIONS {
                let Some((median, p90)) = b.stats(op) else {
                    continue;
                };
                ops.insert(
                    op.to_string(),
                    json!({
                        "median_ms": ms(median),
                        "p90_ms": ms(p90),
                        "ratio": self.ratio(i, op),
                    }),
                );
            }
            if let Some(e) = &b.error {
                ops.insert("error".into(), json!(e));
            }
            bench.insert(col.endpoint.clone(), Value::Object(ops));
            if let Some(m) = &b.memory {
                memory.insert(
                    col.endpoint.clone(),
                    json!({
                        "runtime_pid": m.runtime_pid,
                        "runtime_kib": m.runtime_kib,
                        "helpers_per_pod": m.helpers_per_pod,
                        "helpers_kib": m.helpers_kib,
                    }),
                );
            }
        }
        json!({
            "run_id": self.run_id,
            "endpoints": endpoints,
            "runtimes": runtimes,
            "scenarios": scenarios,
            "bench": bench,
            "memory": memory,
            "interrupted": self.interrupted,
            "passed": self.passed(),
        })
    }

    /// The text report: the scenario table, failures spelled out beneath it, then the timings.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let heads: Vec<String> = self
            .columns
            .iter()
            .map(|c| {
                if c.runtime.is_empty() {
                    c.endpoint.clone()
                } else {
                    c.runtime.clone()
                }
            })
            .collect();
        let name_w = self
            .rows
            .iter()
            .map(|r| r.name.len())
            .max()
            .unwrap_or(8)
            .max(8);
        let col_w: Vec<usize> = heads.iter().map(|h| h.len().max(6)).collect();
        let _ = write!(out, "{:name_w$}", "scenario");
        for (h, w) in heads.iter().zip(&col_w) {
            let _ = write!(out, "  {h:w$}");
        }
        out.push('\n');
        for row in &self.rows {
            let _ = write!(out, "{:name_w$}", row.name);
            for (o, w) in row.results.iter().zip(&col_w) {
                let _ = write!(out, "  {:w$}", o.status());
            }
            out.push('\n');
        }
        let mut notes = String::new();
        for (col, head) in self.columns.iter().zip(&heads) {
            if let Some(e) = &col.setup_error {
                let _ = writeln!(notes, "  {head} ({}): {e}", col.endpoint);
            }
        }
        for row in &self.rows {
            for (o, head) in row.results.iter().zip(&heads) {
                if let Outcome::Fail(m) | Outcome::Skip(m) = o {
                    let _ = writeln!(notes, "  {} on {head}: {}: {m}", row.name, o.status());
                }
            }
        }
        if !notes.is_empty() {
            out.push('\n');
            out.push_str(&notes);
        }
        if self.columns.iter().any(|c| c.bench.is_some()) {
            out.push('\n');
            let _ = write!(out, "{:18}", "operation (ms)");
            for (h, w) in heads.iter().zip(&col_w) {
                let w = (*w).max(22);
                let _ = write!(out, "  {h:w$}");
            }
            out.push('\n');
            for op in OPERATIONS {
                let _ = write!(out, "{op:18}");
                for (i, w) in col_w.iter().enumerate() {
                    let w = (*w).max(22);
                    let b = self.columns[i].bench.as_ref();
                    let cell = match b.and_then(|b| b.stats(op)) {
                        Some((median, p90)) => {
                            let ratio = match self.ratio(i, op) {
                                Some(r) if i > 0 => format!(" x{r:.2}"),
                                _ => String::new(),
                            };
                            format!("{:.1} (p90 {:.1}){ratio}", ms(median), ms(p90))
                        }
                        None => "-".into(),
                    };
                    let _ = write!(out, "  {cell:w$}");
                }
                out.push('\n');
            }
            for (col, head) in self.columns.iter().zip(&heads) {
                let Some(b) = &col.bench else { continue };
                if let Some(m) = &b.memory {
                    let _ = writeln!(
                        out,
                        "{head}: runtime process {} {} KiB; per pod {} KiB in {} helper process(es) [{}]",
                        m.runtime_pid,
                        m.runtime_kib,
                        m.helpers_kib,
                        m.helpers_per_pod.len(),
                        m.helpers_per_pod.join(", ")
                    );
                }
                if let Some(e) = &b.error {
                    let _ = writeln!(out, "{head}: the bench stopped: {e}");
                }
            }
        }
        if self.interrupted {
            out.push_str("\ninterrupted: the run was stopped before its end\n");
        }
        out
    }

    /// JUnit XML: a test suite per runtime, a test case per scenario.
    pub fn to_junit(&self) -> String {
        let mut out = String::from(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"cri-check\">\n",
        );
        for (i, col) in self.columns.iter().enumerate() {
            let outcomes = self.rows.iter().filter_map(|r| r.results.get(i));
            let failures = outcomes
                .clone()
                .filter(|o| matches!(o, Outcome::Fail(_)))
                .count();
            let skipped = outcomes.filter(|o| matches!(o, Outcome::Skip(_))).count();
            let _ = writeln!(
                out,
                "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\" skipped=\"{skipped}\">",
                xml(&col.endpoint),
                self.rows.len()
            );
            for row in &self.rows {
                let _ = write!(
                    out,
                    "    <testcase classname=\"{}\" name=\"{}\"",
                    xml(&col.endpoint),
                    row.name
                );
                match row.results.get(i) {
                    Some(Outcome::Fail(m)) => {
                        let _ = writeln!(
                            out,
                            ">\n      <failure message=\"{}\"/>\n    </testcase>",
                            xml(m)
                        );
                    }
                    Some(Outcome::Skip(m)) => {
                        let _ = writeln!(
                            out,
                            ">\n      <skipped message=\"{}\"/>\n    </testcase>",
                            xml(m)
                        );
                    }
                    _ => out.push_str("/>\n"),
                }
            }
            out.push_str("  </testsuite>\n");
        }
        out.push_str("</testsuites>\n");
        out
    }
}

fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

/// `s` escaped for an XML attribute.
fn xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\n' => out.push_str("&#10;"),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn bench(ms: &[u64]) -> Bench {
        let samples = OPERATIONS
            .iter()
            .map(|_| ms.iter().map(|m| Duration::from_millis(*m)).collect())
            .collect();
        Bench {
            samples,
            ..Default::default()
        }
    }

    fn report() -> Report {
        let column = |endpoint: &str, runtime: &str, ms: &[u64]| Column {
            endpoint: endpoint.into(),
            runtime: runtime.into(),
            bench: Some(bench(ms)),
            setup_error: None,
        };
        Report {
            run_id: "r1".into(),
            columns: vec![
                column("unix:///a.sock", "a 1", &[1, 2, 3, 4, 10]),
                column("unix:///b.sock", "b 2", &[6, 6, 6, 6, 6]),
            ],
            rows: vec![
                Row {
                    name: "first",
                    results: vec![
                        Outcome::Pass,
                        Outcome::Fail("StopX: got <NotFound> & \"so\"".into()),
                    ],
                },
                Row {
                    name: "second",
                    results: vec![Outcome::Pass, Outcome::Skip("no pod network".into())],
                },
            ],
            interrupted: false,
        }
    }

    #[test]
    fn json_has_the_issue_shape_and_ratios_against_the_first_endpoint() {
        let r = report();
        assert!(!r.passed());
        let j = r.to_json();
        assert_eq!(j["endpoints"], json!(["unix:///a.sock", "unix:///b.sock"]));
        assert_eq!(j["scenarios"][0]["name"], "first");
        assert_eq!(
            j["scenarios"][0]["results"]["unix:///b.sock"],
            json!({"status": "fail", "message": "StopX: got <NotFound> & \"so\""})
        );
        assert_eq!(
            j["scenarios"][1]["results"]["unix:///b.sock"]["status"],
            "skip"
        );
        assert_eq!(
            j["scenarios"][1]["results"]["unix:///a.sock"]["message"],
            ""
        );
        let op = OPERATIONS[0];
        // Medians 3 and 6 ms; the 90th percentile of a's five samples is its largest.
        assert_eq!(
            j["bench"]["unix:///a.sock"][op],
            json!({"median_ms": 3.0, "p90_ms": 10.0, "ratio": 1.0})
        );
        assert_eq!(j["bench"]["unix:///b.sock"][op]["ratio"], 2.0);
        assert_eq!(j["passed"], false);
    }

    #[test]
    fn passing_needs_no_failure_and_no_interruption() {
        let mut r = report();
        r.rows[0].results[1] = Outcome::Pass;
        assert!(r.passed(), "skips do not fail a run");
        r.interrupted = true;
        assert!(!r.passed());
    }

    #[test]
    fn text_and_junit_name_each_runtime_and_escape_messages() {
        let r = report();
        let text = r.to_text();
        let head = text.lines().next().unwrap();
        assert!(head.contains("a 1") && head.contains("b 2"), "{head}");
        assert!(text.contains("StopX: got <NotFound>"), "{text}");
        assert!(text.contains("x2.00"), "{text}");
        let junit = r.to_junit();
        assert!(
            junit.contains("tests=\"2\" failures=\"1\" skipped=\"1\""),
            "{junit}"
        );
        assert!(
            junit.contains(
                "<failure message=\"StopX: got &lt;NotFound&gt; &amp; &quot;so&quot;\"/>"
            ),
            "{junit}"
        );
        assert_eq!(junit.matches("<testsuite ").count(), 2);
    }
}
