//! Directories and file metadata on loopback: trees with empty entries, links, modes, times and
//! names that are not UTF-8, under every strategy. Real processes; no root.

use std::path::Path;
use std::time::Duration;

// Not every helper in `common` is used here.
#[allow(dead_code, unused_imports)]
mod common;
use common::run::{agents, leftovers, report, report_ok, send, to_list};
use common::{hash, make_file, secret, Scratch};

const MIB: u64 = 1 << 20;

#[test]
fn directory_keeps_its_tree() {
    let s = Scratch::new("dir");
    let src = s.0.join("dataset");
    std::fs::create_dir_all(src.join("a/b")).unwrap();
    std::fs::create_dir_all(src.join("empty")).unwrap();
    make_file(&src.join("a/b/one.bin"), 3 * MIB + 1, b"1");
    make_file(&src.join("a/two.bin"), 10, b"2");
    make_file(&src.join("zero.bin"), 0, b"3");
    make_file(&src.join("three.bin"), 2 * MIB, b"4");
    let key = secret(3);
    let ags = agents(&s.0.join("rx"), 3, &key);
    // Receivers given by a hosts file: the report uses its names.
    let hosts = s.0.join("hosts.toml");
    let mut toml = String::from("[source]\nname = \"origin\"\n");
    for (i, a) in ags.iter().enumerate() {
        toml += &format!(
            "[[host]]\nname = \"site-{i}\"\naddr = \"{}\"\nsite = \"lab\"\n",
            a.addr
        );
    }
    std::fs::write(&hosts, toml).unwrap();
    let out = send(
        &[
            src.to_str().unwrap(),
            "--to",
            hosts.to_str().unwrap(),
            "--chunk-kib",
            "64",
            "--fanout",
            "1",
        ],
        &key,
        None,
    );
    let r = report(&out);
    assert_eq!(r["object"]["kind"], "dir");
    assert_eq!(r["receivers"][2]["name"], "site-2");
    assert_eq!(r["receivers"][2]["parent"], "site-1");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for a in &ags {
        for f in ["a/b/one.bin", "a/two.bin", "zero.bin", "three.bin"] {
            assert_eq!(
                hash(&a.dir.join("dataset").join(f)),
                hash(&src.join(f)),
                "{f}"
            );
        }
        assert!(a.dir.join("dataset/empty").is_dir());
    }
}

/// Sets a file's or a directory's modification time (seconds since the epoch).
fn set_mtime(path: &Path, secs: u64) {
    let t = std::time::UNIX_EPOCH + Duration::from_secs(secs);
    std::fs::File::open(path).unwrap().set_modified(t).unwrap();
}

fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

fn mtime_of(path: &Path) -> std::time::SystemTime {
    std::fs::symlink_metadata(path).unwrap().modified().unwrap()
}

/// A directory with everything a tree can hold: empty files and directories, links in and out
/// of the tree, modes with and without setuid, set times and a name that is not UTF-8.
fn odd_tree(src: &Path) {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{symlink, PermissionsExt};
    let chmod = |p: &str, m: u32| {
        std::fs::set_permissions(src.join(p), std::fs::Permissions::from_mode(m)).unwrap()
    };
    std::fs::create_dir_all(src.join("sub/empty/emptier")).unwrap();
    make_file(&src.join("data.bin"), 300_000, b"odd");
    make_file(&src.join("empty.bin"), 0, b"");
    make_file(&src.join("x750.bin"), 10, b"750");
    make_file(&src.join("suid.bin"), 10, b"suid");
    make_file(
        &src.join(std::ffi::OsStr::from_bytes(b"not-utf8-\xff.bin")),
        10,
        b"x",
    );
    chmod("x750.bin", 0o750);
    chmod("suid.bin", 0o4755);
    chmod("sub", 0o750);
    symlink("data.bin", src.join("link")).unwrap();
    symlink("../data.bin", src.join("sub/up")).unwrap();
    symlink("../../outside", src.join("sub/escape")).unwrap();
    symlink("/etc/passwd", src.join("abs")).unwrap();
    set_mtime(&src.join("data.bin"), 1_000_000_000);
    set_mtime(&src.join("sub/empty"), 1_100_000_000);
    set_mtime(&src.join("sub"), 1_200_000_000);
}

/// What arrives of [`odd_tree`] at `got` (`suid`: the setuid bit was asked to be kept).
fn check_odd_tree(src: &Path, got: &Path, suid: bool) {
    assert_eq!(hash(&got.join("data.bin")), hash(&src.join("data.bin")));
    assert_eq!(std::fs::read(got.join("empty.bin")).unwrap(), b"");
    assert!(got.join("sub/empty/emptier").is_dir());
    assert_eq!(
        std::fs::read_link(got.join("link")).unwrap(),
        Path::new("data.bin")
    );
    assert_eq!(
        std::fs::read_link(got.join("sub/up")).unwrap(),
        Path::new("../data.bin")
    );
    assert_eq!(hash(&got.join("sub/up")), hash(&src.join("data.bin")));
    for left_out in ["sub/escape", "abs"] {
        assert!(
            std::fs::symlink_metadata(got.join(left_out)).is_err(),
            "{left_out}"
        );
    }
    let names: Vec<String> = leftovers(got);
    assert!(
        !names.iter().any(|n| n.starts_with("not-utf8")),
        "{names:?}"
    );
    assert_eq!(mode_of(&got.join("x750.bin")), 0o750);
    assert_eq!(
        mode_of(&got.join("suid.bin")),
        if suid { 0o4755 } else { 0o755 }
    );
    assert_eq!(mode_of(&got.join("sub")), 0o750);
    for p in ["data.bin", "sub/empty", "sub", "link", ""] {
        assert_eq!(mtime_of(&got.join(p)), mtime_of(&src.join(p)), "{p:?}");
    }
}

#[test]
fn directory_arrives_as_it_left_and_reports_what_it_left_out() {
    let s = Scratch::new("odd");
    let src = s.0.join("odd");
    odd_tree(&src);
    set_mtime(&src, 1_300_000_000);
    let key = secret(26);
    let ags = agents(&s.0.join("rx"), 2, &key);
    let list = to_list(&ags);
    for (strategy, keep) in [("auto", false), ("mob", true)] {
        let mut args = vec![src.to_str().unwrap(), "--to", &list, "--strategy", strategy];
        if keep {
            args.push("--keep-special-modes");
        }
        let out = send(&args, &key, None);
        let err = String::from_utf8_lossy(&out.stderr);
        // Delivered, but not whole: neither success nor a failed receiver.
        assert_eq!(out.status.code(), Some(3), "{strategy}: {err}");
        assert!(
            err.contains("3 entries of the directory were left out"),
            "{err}"
        );
        let r = report(&out);
        assert_eq!(r["ok"], true, "{r}");
        let skipped: Vec<&str> = r["object"]["skipped"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["path"].as_str().unwrap())
            .collect();
        assert_eq!(
            skipped,
            ["abs", "not-utf8-\u{fffd}.bin", "sub/escape"],
            "{r}"
        );
        for a in &ags {
            check_odd_tree(&src, &a.dir.join("odd"), keep);
            // Nothing beside the copy and the record that lets a later send of it move
            // nothing: no temporary tree, nothing a link led out to.
            let mut left = leftovers(&a.dir);
            left.sort();
            assert_eq!(left, vec![".odd.bulkcast.done", "odd"]);
        }
    }
}

#[test]
fn empty_file_and_empty_directory_with_every_strategy() {
    let s = Scratch::new("empty");
    let key = secret(27);
    let ags = agents(&s.0.join("rx"), 3, &key);
    let list = to_list(&ags);
    // Capacities, which balanced needs and which make auto and tree plan.
    let hosts = s.0.join("hosts.toml");
    let mut toml = String::new();
    for (i, a) in ags.iter().enumerate() {
        toml += &format!(
            "[[host]]\nname = \"h{i}\"\naddr = \"{}\"\nuplink_mbps = 1000\ndownlink_mbps = 1000\n",
            a.addr
        );
    }
    std::fs::write(&hosts, toml).unwrap();
    let file = s.0.join("nothing.bin");
    make_file(&file, 0, b"");
    let dir = s.0.join("nothing");
    std::fs::create_dir_all(dir.join("inside/deeper")).unwrap();
    let cases = [
        ("auto", list.as_str()),
        ("auto", hosts.to_str().unwrap()),
        ("tree", list.as_str()),
        ("flat", list.as_str()),
        ("balanced", hosts.to_str().unwrap()),
        ("mob", list.as_str()),
        ("swarm", list.as_str()),
        ("hybrid", list.as_str()),
    ];
    for (strategy, to) in cases {
        for obj in [&file, &dir] {
            for a in &ags {
                let _ = std::fs::remove_dir_all(a.dir.join("nothing"));
                let _ = std::fs::remove_file(a.dir.join("nothing.bin"));
            }
            let out = send(
                &[obj.to_str().unwrap(), "--to", to, "--strategy", strategy],
                &key,
                None,
            );
            let r = report_ok(&out);
            assert_eq!(r["object"]["bytes"], 0, "{strategy}: {r}");
            for a in &ags {
                if obj == &file {
                    let got = a.dir.join("nothing.bin");
                    assert_eq!(std::fs::read(&got).unwrap(), b"", "{strategy}");
                } else {
                    let got = a.dir.join("nothing/inside/deeper");
                    assert!(got.is_dir(), "{strategy}: {}", got.display());
                }
            }
        }
    }
}

#[test]
fn a_single_file_keeps_its_mode_and_time_as_a_directory_would() {
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new("filemode");
    let key = secret(28);
    let ags = agents(&s.0.join("rx"), 2, &key);
    let src = s.0.join("tool");
    make_file(&src, 100_000, b"tool");
    std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o4750)).unwrap();
    set_mtime(&src, 1_234_567_890);
    for strategy in ["tree", "hybrid"] {
        let out = send(
            &[
                src.to_str().unwrap(),
                "--to",
                &to_list(&ags),
                "--strategy",
                strategy,
            ],
            &key,
            None,
        );
        report_ok(&out);
        for a in &ags {
            let got = a.dir.join("tool");
            assert_eq!(hash(&got), hash(&src));
            // The permission bits; setuid only when asked (--keep-special-modes).
            assert_eq!(mode_of(&got), 0o750, "{strategy}");
            assert_eq!(mtime_of(&got), mtime_of(&src), "{strategy}");
        }
    }
}

#[test]
fn follow_symlinks_sends_what_links_point_at() {
    use std::os::unix::fs::symlink;
    let s = Scratch::new("follow");
    let key = secret(29);
    let ags = agents(&s.0.join("rx"), 2, &key);
    let src = s.0.join("snap");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(s.0.join("blobs")).unwrap();
    make_file(&s.0.join("blobs/w.bin"), 200_000, b"w");
    symlink("../blobs/w.bin", src.join("model.bin")).unwrap();
    symlink("../blobs", src.join("all")).unwrap();
    symlink("nowhere", src.join("dangling")).unwrap();
    let out = send(
        &[
            src.to_str().unwrap(),
            "--to",
            &to_list(&ags),
            "--follow-symlinks",
        ],
        &key,
        None,
    );
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(report(&out)["object"]["skipped"][0]["path"], "dangling");
    for a in &ags {
        let got = a.dir.join("snap");
        for p in ["model.bin", "all/w.bin"] {
            assert!(
                std::fs::symlink_metadata(got.join(p)).unwrap().is_file(),
                "{p}"
            );
            assert_eq!(hash(&got.join(p)), hash(&s.0.join("blobs/w.bin")), "{p}");
        }
        assert!(std::fs::symlink_metadata(got.join("all")).unwrap().is_dir());
    }
}
