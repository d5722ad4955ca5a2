//! Slurm's compressed host lists (`node[01-04,07],gpu[1-2]-ib`), as in `$SLURM_JOB_NODELIST`
//! and `scontrol show hostnames`, for `send --hostfile`.

use anyhow::{bail, Context, Result};

/// More hosts than any list should name: a typo like `n[1-999999999]` is refused, not expanded.
const MAX_HOSTS: usize = 100_000;

/// Expands one list: comma-separated names, each with any number of `[ranges]`; a range is
/// `7`, `01-04` (zero-padded to the width of its lower bound, as Slurm pads) or several of
/// those separated by commas.
pub fn expand(list: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for item in split_top(list)? {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        expand_item(item, &mut out).with_context(|| format!("host list {list:?}"))?;
    }
    Ok(out)
}

/// Every host of a host file: lines of host lists; `#` starts a comment.
pub fn read_file(text: &str) -> Result<Vec<String>> {
    let mut hosts = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("");
        hosts.extend(expand(line).with_context(|| format!("line {}", n + 1))?);
    }
    Ok(hosts)
}

/// Splits at the commas outside brackets.
fn split_top(list: &str) -> Result<Vec<&str>> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            bail!("host list {list:?}: brackets do not match");
        }
    }
    if depth != 0 {
        bail!("host list {list:?}: brackets do not match");
    }
    parts.push(&list[start..]);
    Ok(parts)
}

/// `prefix[ranges]rest` into `out`, `rest` expanded in turn.
fn expand_item(item: &str, out: &mut Vec<String>) -> Result<()> {
    let Some(open) = item.find('[') else {
        if item.contains(']') {
            bail!("a ']' without its '['");
        }
        out.push(item.to_string());
        return Ok(());
    };
    let close = item[open..].find(']').context("a '[' without its ']'")? + open;
    let (prefix, ranges, rest) = (&item[..open], &item[open + 1..close], &item[close + 1..]);
    let mut tails = Vec::new();
    expand_item_or_empty(rest, &mut tails)?;
    for r in ranges.split(',') {
        let (lo, hi) = r.split_once('-').unwrap_or((r, r));
        let width = if lo.len() > 1 && lo.starts_with('0') {
            lo.len()
        } else {
            0
        };
        let parse = |s: &str| -> Result<u64> {
            s.trim()
                .parse()
                .with_context(|| format!("{s:?} in [{ranges}] is not a number"))
        };
        let (a, b) = (parse(lo)?, parse(hi)?);
        if b < a {
            bail!("range {r} in [{ranges}] runs backwards");
        }
        if (b - a) as usize >= MAX_HOSTS
            || out.len() + tails.len() * (b - a + 1) as usize > MAX_HOSTS
        {
            bail!("more than {MAX_HOSTS} hosts");
        }
        for n in a..=b {
            for t in &tails {
                out.push(format!("{prefix}{n:0width$}{t}"));
            }
        }
    }
    Ok(())
}

fn expand_item_or_empty(rest: &str, out: &mut Vec<String>) -> Result<()> {
    if rest.is_empty() {
        out.push(String::new());
        Ok(())
    } else {
        expand_item(rest, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_lists_expand_as_scontrol_show_hostnames_does() {
        assert_eq!(
            expand("node[01-04,07]").unwrap(),
            ["node01", "node02", "node03", "node04", "node07"]
        );
        assert_eq!(
            expand("gpu[8-11],login1,rack[1-2]-n[09-10]").unwrap(),
            [
                "gpu8",
                "gpu9",
                "gpu10",
                "gpu11",
                "login1",
                "rack1-n09",
                "rack1-n10",
                "rack2-n09",
                "rack2-n10"
            ]
        );
        assert_eq!(
            expand("a[098-101]").unwrap(),
            ["a098", "a099", "a100", "a101"]
        );
        assert_eq!(expand(" solo ").unwrap(), ["solo"]);
        assert!(expand("").unwrap().is_empty());
    }

    #[test]
    fn bad_lists_are_refused_with_the_reason() {
        for (bad, why) in [
            ("node[01-04", "brackets"),
            ("node01]", "brackets"),
            ("n[[1]]", "brackets"),
            ("n[4-1]", "backwards"),
            ("n[a-b]", "not a number"),
            ("n[1-999999999]", "more than"),
        ] {
            let e = format!("{:#}", expand(bad).unwrap_err());
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn host_files_take_lists_per_line_and_comments() {
        let text = "# the job's nodes\nnode[1-2]\n\nnode5 # spare\n";
        assert_eq!(read_file(text).unwrap(), ["node1", "node2", "node5"]);
        let e = format!("{:#}", read_file("ok\nbad[\n").unwrap_err());
        assert!(e.contains("line 2"), "{e}");
    }
}
