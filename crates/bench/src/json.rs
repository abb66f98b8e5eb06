//! One-line JSON output (`--json`), with serde and serde_json: each binary derives
//! `Serialize` for its output and prints it with [`line()`].

use serde::{Serialize, Serializer};

/// `v` as one line of JSON.
///
/// ```
/// #[derive(serde::Serialize)]
/// struct Out<'a> { tool: &'a str, n: u64 }
/// assert_eq!(rdma_bench::json::line(&Out { tool: "x", n: 3 }), r#"{"tool":"x","n":3}"#);
/// ```
pub fn line<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("output structs serialize")
}

/// A measured number as the outputs write it: rounded to 6 decimals, `null` when not
/// finite.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Num(pub f64);

impl Serialize for Num {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0.is_finite() {
            s.serialize_f64((self.0 * 1e6).round() / 1e6)
        } else {
            s.serialize_none()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line() {
        #[derive(Serialize)]
        struct Item {
            k: u64,
        }
        #[derive(Serialize)]
        struct Out<'a> {
            a: &'a str,
            n: u64,
            f: Num,
            bad: Num,
            r: Vec<Item>,
        }
        let o = Out {
            a: "x\"y\n",
            n: 3,
            f: Num(1.2345678),
            bad: Num(f64::NAN),
            r: vec![Item { k: 1 }],
        };
        assert_eq!(
            line(&o),
            r#"{"a":"x\"y\n","n":3,"f":1.234568,"bad":null,"r":[{"k":1}]}"#
        );
    }
}
