//! Products from a watched directory (`feed insert --watch DIR`): every complete file that
//! appears in DIR is inserted once, also across restarts.
//!
//! The directory is scanned every [`WatchConfig::poll`]; a file is *ready* when nobody has
//! written it for [`WatchConfig::settle`]: its size and mtime are the same over `settle` of
//! scans, or its mtime is already `settle` old (a file renamed into place after it was
//! written, or one there before the watcher started). Dotfiles, `*.tmp` and `*.part` are
//! never inserted, so a writer that fills `name.tmp` and renames it is safe at any pace; one
//! that writes in place must not pause longer than `settle`.
//!
//! Each file inserted is recorded by name, size and mtime in a state file (a dotfile in DIR
//! by default) before it is removed or moved, so a restart inserts nothing twice; entries of
//! files gone from DIR are dropped when the watcher starts.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use super::ingest::{insert_from, InsertError, Target};

/// The state file's name in DIR (a dotfile: never taken for a product).
pub const STATE_FILE: &str = ".bulkcast-watch-state";

/// A file's identity in the directory: a rewrite changes it, a rename into place keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stamp {
    /// Size in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the Unix epoch (negative before it).
    pub mtime_ns: i128,
}

impl Stamp {
    /// The stamp of a file's metadata.
    pub fn of(m: &fs::Metadata) -> Stamp {
        Stamp {
            size: m.len(),
            mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
        }
    }
}

/// Whether a name in DIR is never a product: dotfiles (also the state file and the
/// `.name.XXXXXX` of rsync), `*.tmp`, `*.part`.
pub fn ignored(name: &str) -> bool {
    name.starts_with('.') || name.ends_with(".tmp") || name.ends_with(".part")
}

/// The "is this file complete" decision, fed by scans.
#[derive(Debug, Default)]
pub struct Settle {
    /// Per name: the stamp seen last and since when (monotonic).
    seen: HashMap<String, (Stamp, Instant)>,
}

impl Settle {
    /// Records a scan's view of `name`; true if it is ready: unchanged for `settle` of
    /// scans, or its mtime `settle` before `wall` (the wall clock now).
    pub fn observe(
        &mut self,
        name: &str,
        stamp: Stamp,
        now: Instant,
        wall: SystemTime,
        settle: Duration,
    ) -> bool {
        let since = match self.seen.get_mut(name) {
            Some((s, since)) if *s == stamp => *since,
            Some(e) => {
                *e = (stamp, now);
                now
            }
            None => {
                self.seen.insert(name.to_string(), (stamp, now));
                now
            }
        };
        let wall_ns = wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        now.duration_since(since) >= settle || wall_ns - stamp.mtime_ns >= settle.as_nanos() as i128
    }

    /// Forgets a name (inserted, or gone from DIR).
    pub fn forget(&mut self, name: &str) {
        self.seen.remove(name);
    }

    /// Forgets every name not in `present`.
    pub fn keep_only(&mut self, present: &HashSet<&str>) {
        self.seen.retain(|n, _| present.contains(n.as_str()));
    }
}

/// The files inserted, by name, as the state file keeps them: `SIZE MTIME_NS NAME` a line.
#[derive(Debug, Default)]
pub struct Done {
    files: HashMap<String, Stamp>,
}

impl Done {
    /// Parses a state file's text; lines that are not entries are skipped.
    pub fn parse(text: &str) -> Done {
        let mut files = HashMap::new();
        for line in text.lines() {
            let mut f = line.splitn(3, ' ');
            let (Some(size), Some(mtime), Some(name)) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            if let (Ok(size), Ok(mtime_ns)) = (size.parse(), mtime.parse()) {
                files.insert(name.to_string(), Stamp { size, mtime_ns });
            }
        }
        Done { files }
    }

    /// One entry's line.
    pub fn line(name: &str, s: Stamp) -> String {
        format!("{} {} {name}\n", s.size, s.mtime_ns)
    }

    /// Whether `name` with this stamp was inserted.
    pub fn contains(&self, name: &str, s: Stamp) -> bool {
        self.files.get(name) == Some(&s)
    }

    /// Records an insert.
    pub fn add(&mut self, name: &str, s: Stamp) {
        self.files.insert(name.to_string(), s);
    }

    /// Keeps only the entries whose file is still in DIR unchanged (`present`).
    pub fn retain_present(&mut self, present: &HashMap<String, Stamp>) {
        self.files.retain(|n, s| present.get(n) == Some(s));
    }

    /// The state file's text.
    pub fn text(&self) -> String {
        let mut v: Vec<_> = self.files.iter().collect();
        v.sort_by_key(|(n, _)| *n);
        v.into_iter().map(|(n, s)| Done::line(n, *s)).collect()
    }
}

/// What happens to a file once inserted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum After {
    /// It stays in DIR (recorded in the state file).
    Leave,
    /// It is deleted.
    Remove,
    /// It is renamed into this directory (same filesystem).
    MoveTo(PathBuf),
}

/// A watcher's settings.
#[derive(Debug, Clone)]
pub struct WatchConfig {
    /// The directory.
    pub dir: PathBuf,
    /// Time without writes after which a file is complete.
    pub settle: Duration,
    /// Time between scans.
    pub poll: Duration,
    /// What to do with a file once inserted.
    pub after: After,
    /// The state file.
    pub state: PathBuf,
}

/// What the watcher did.
#[derive(Debug)]
pub enum WatchEvent<'a> {
    /// A file is queued as a product.
    Inserted {
        /// Its sequence number.
        seq: u64,
        /// Its name.
        name: &'a str,
        /// Its size.
        size: u64,
    },
    /// A file is not inserted, until it changes (refused by the source, unreadable, a name
    /// that cannot be a product).
    Skipped {
        /// Its name.
        name: &'a str,
        /// Why.
        error: &'a str,
    },
    /// The source cannot be reached; the watcher tries again.
    SourceDown {
        /// Why.
        error: &'a str,
    },
    /// Something that did not stop the watcher (a file it could not remove or move, a
    /// state file it could not write).
    Warning {
        /// What.
        error: &'a str,
    },
}

/// One scan: the candidate files of DIR (regular files, not [`ignored`]) with their stamps,
/// and names that cannot be products (not UTF-8, a newline).
pub fn scan(dir: &Path) -> io::Result<(HashMap<String, Stamp>, Vec<String>)> {
    let mut files = HashMap::new();
    let mut bad = Vec::new();
    for e in fs::read_dir(dir)? {
        let e = e?;
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            bad.push(e.file_name().to_string_lossy().into_owned());
            continue;
        };
        if ignored(&name) {
            continue;
        }
        // Follows symlinks; a file gone since readdir is simply not there.
        let Ok(m) = fs::metadata(e.path()) else {
            continue;
        };
        if !m.is_file() {
            continue;
        }
        if name.contains('\n') {
            bad.push(name);
            continue;
        }
        files.insert(name, Stamp::of(&m));
    }
    Ok((files, bad))
}

/// Checks the directory and the state file; loads the state (dropping entries of files no
/// longer in DIR).
fn start(cfg: &WatchConfig) -> io::Result<Done> {
    let meta = fs::metadata(&cfg.dir).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("watched directory {}: {e}", cfg.dir.display()),
        )
    })?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!(
            "watched directory {} is not a directory",
            cfg.dir.display()
        )));
    }
    if let After::MoveTo(to) = &cfg.after {
        if !fs::metadata(to).is_ok_and(|m| m.is_dir()) {
            return Err(io::Error::other(format!(
                "--move-to {}: not a directory",
                to.display()
            )));
        }
    }
    let mut done = match fs::read_to_string(&cfg.state) {
        Ok(t) => Done::parse(&t),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Done::default(),
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!("state file {}: {e}", cfg.state.display()),
            ))
        }
    };
    let (present, _) = scan(&cfg.dir)?;
    done.retain_present(&present);
    let tmp = cfg.state.with_extension("new");
    fs::write(&tmp, done.text())
        .and_then(|_| fs::rename(&tmp, &cfg.state))
        .map_err(|e| {
            io::Error::new(e.kind(), format!("state file {}: {e}", cfg.state.display()))
        })?;
    Ok(done)
}

/// Watches `cfg.dir` until it fails (the directory gone or unreadable): inserts each
/// complete file once, oldest first, and reports every step.
pub async fn watch(
    to: &Target<'_>,
    cfg: &WatchConfig,
    mut report: impl FnMut(WatchEvent<'_>),
) -> io::Result<()> {
    let mut w = Watcher {
        cfg,
        done: start(cfg)?,
        settle: Settle::default(),
        skipped: HashMap::new(),
        down: false,
        backoff: cfg.poll,
    };
    loop {
        let dir = cfg.dir.clone();
        let (files, bad) = tokio::task::spawn_blocking(move || scan(&dir))
            .await
            .map_err(io::Error::other)?
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("watched directory {}: {e}", cfg.dir.display()),
                )
            })?;
        let pause = w.round(to, files, &bad, &mut report).await;
        tokio::time::sleep(pause).await;
    }
}

struct Watcher<'c> {
    cfg: &'c WatchConfig,
    done: Done,
    settle: Settle,
    /// Files not to try again until they change, with the stamp they had.
    skipped: HashMap<String, Option<Stamp>>,
    /// The source was unreachable at the last try.
    down: bool,
    /// The pause after a round that found the source down (doubles up to 30 s).
    backoff: Duration,
}

impl Watcher<'_> {
    /// Reports a file skipped once per stamp.
    fn skip(
        &mut self,
        name: &str,
        stamp: Option<Stamp>,
        error: &str,
        report: &mut impl FnMut(WatchEvent<'_>),
    ) {
        if self.skipped.get(name) != Some(&stamp) {
            report(WatchEvent::Skipped { name, error });
            self.skipped.insert(name.to_string(), stamp);
        }
    }

    /// Inserts the ready files of a scan (`bad`: names that cannot be products); returns the pause before the next scan.
    async fn round(
        &mut self,
        to: &Target<'_>,
        files: HashMap<String, Stamp>,
        bad: &[String],
        report: &mut impl FnMut(WatchEvent<'_>),
    ) -> Duration {
        let present: HashSet<&str> = files.keys().map(String::as_str).collect();
        self.settle.keep_only(&present);
        self.skipped
            .retain(|n, _| present.contains(n.as_str()) || bad.contains(n));
        for name in bad {
            let error = "the name is not UTF-8 or holds a newline";
            self.skip(name, None, error, report);
        }
        let (now, wall) = (Instant::now(), SystemTime::now());
        let mut ready: Vec<(&String, Stamp)> = files
            .iter()
            .filter(|(n, s)| !self.done.contains(n, **s))
            .filter(|(n, s)| self.skipped.get(*n) != Some(&Some(**s)))
            .map(|(n, s)| (n, *s))
            .collect();
        ready.retain(|(n, s)| self.settle.observe(n, *s, now, wall, self.cfg.settle));
        // Arrival order: oldest write first.
        ready.sort_by(|a, b| (a.1.mtime_ns, a.0).cmp(&(b.1.mtime_ns, b.0)));
        for (name, stamp) in ready {
            match self.insert(to, name, stamp).await {
                Ok(Some(seq)) => {
                    if self.down {
                        self.down = false;
                        self.backoff = self.cfg.poll;
                    }
                    report(WatchEvent::Inserted {
                        seq,
                        name,
                        size: stamp.size,
                    });
                    self.finish(name, stamp, report);
                }
                // Changed since the scan: the next scans settle it again.
                Ok(None) => self.settle.forget(name),
                Err(Failure::Source(error)) => {
                    if !self.down {
                        report(WatchEvent::SourceDown { error: &error });
                        self.down = true;
                    }
                    self.backoff = (self.backoff * 2).min(Duration::from_secs(30));
                    return self.backoff;
                }
                Err(Failure::File(e)) => self.skip(name, Some(stamp), &e, report),
            }
        }
        self.cfg.poll
    }

    /// Inserts one file if it still has the stamp the scan saw (`Ok(None)` if not).
    async fn insert(
        &self,
        to: &Target<'_>,
        name: &str,
        stamp: Stamp,
    ) -> Result<Option<u64>, Failure> {
        let path = self.cfg.dir.join(name);
        let file = match tokio::fs::File::open(&path).await {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Failure::File(format!("cannot read it: {e}"))),
        };
        let meta = file
            .metadata()
            .await
            .map_err(|e| Failure::File(e.to_string()))?;
        if Stamp::of(&meta) != stamp {
            return Ok(None);
        }
        let mut data = tokio::io::BufReader::with_capacity(1 << 20, file);
        match insert_from(
            to.server,
            to.keys,
            to.tuning,
            name,
            to.feedtype,
            stamp.size,
            &mut data,
        )
        .await
        {
            Ok(seq) => Ok(Some(seq)),
            // Shrunk while read: a writer is at it again.
            Err(InsertError::Truncated { .. }) => Ok(None),
            Err(InsertError::Refused(r)) => {
                Err(Failure::File(format!("refused by the feed source: {r}")))
            }
            Err(InsertError::Io(e)) => Err(Failure::Source(e.to_string())),
        }
    }

    /// Records an inserted file, then removes or moves it.
    fn finish(&mut self, name: &str, stamp: Stamp, report: &mut impl FnMut(WatchEvent<'_>)) {
        self.done.add(name, stamp);
        self.settle.forget(name);
        let appended = fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&self.cfg.state)
            .and_then(|mut f| f.write_all(Done::line(name, stamp).as_bytes()));
        if let Err(e) = appended {
            let error = format!("state file {}: {e}", self.cfg.state.display());
            report(WatchEvent::Warning { error: &error });
        }
        let path = self.cfg.dir.join(name);
        let r = match &self.cfg.after {
            After::Leave => Ok(()),
            After::Remove => fs::remove_file(&path),
            After::MoveTo(to) => fs::rename(&path, to.join(name)),
        };
        if let Err(e) = r {
            let error = format!("{}: {e}", path.display());
            report(WatchEvent::Warning { error: &error });
        }
    }
}

/// Why a file was not inserted.
enum Failure {
    /// The file's fault (unreadable, refused by the source): not tried again until it changes.
    File(String),
    /// The source's (unreachable, connection lost): tried again.
    Source(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn stamp(size: u64, mtime_s: i128) -> Stamp {
        Stamp {
            size,
            mtime_ns: mtime_s * 1_000_000_000,
        }
    }

    #[test]
    fn temporary_and_hidden_names_are_ignored() {
        for n in [".x", STATE_FILE, ".grid.bin.Xy12Zq", "a.tmp", "a.part"] {
            assert!(ignored(n), "{n}");
        }
        for n in ["a", "a.tmp.grib2", "tmp", "part.bin"] {
            assert!(!ignored(n), "{n}");
        }
    }

    #[test]
    fn a_file_is_ready_once_unwritten_for_the_settle_time() {
        let t0 = Instant::now();
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let mut s = Settle::default();
        // Written just now: not ready at once, nor while it grows.
        assert!(!s.observe("f", stamp(10, 1000), t0, wall, S));
        let t = t0 + Duration::from_millis(600);
        assert!(!s.observe("f", stamp(20, 1000), t, wall, S));
        assert!(!s.observe(
            "f",
            stamp(20, 1000),
            t + Duration::from_millis(900),
            wall,
            S
        ));
        // Unchanged for the settle time by the monotonic clock (the wall clock stood still).
        assert!(s.observe("f", stamp(20, 1000), t + S, wall, S));
        // A file written long ago (renamed into place, or there before the start): at once.
        assert!(s.observe("old", stamp(5, 998), t0, wall, S));
        // An mtime in the future (a skewed clock) waits for the monotonic clock.
        assert!(!s.observe("skew", stamp(5, 5000), t0, wall, S));
        assert!(s.observe("skew", stamp(5, 5000), t0 + S, wall, S));
        // Forgotten names start over.
        s.forget("f");
        assert!(!s.observe("f", stamp(20, 1000), t + S, wall, S));
        s.keep_only(&HashSet::new());
        assert!(s.seen.is_empty());
    }

    #[test]
    fn the_state_keeps_names_with_spaces_and_drops_files_gone() {
        let mut d = Done::default();
        d.add("SDUS53 KARX 271200 /pNCRARX", stamp(3, 7));
        d.add("b", stamp(4, -1));
        let mut back = Done::parse(&format!("{}garbage\n1 x\n", d.text()));
        assert!(back.contains("SDUS53 KARX 271200 /pNCRARX", stamp(3, 7)));
        assert!(back.contains("b", stamp(4, -1)));
        assert!(
            !back.contains("b", stamp(4, 0)),
            "a rewrite is a new product"
        );
        assert_eq!(back.files.len(), 2);
        let present = HashMap::from([("b".to_string(), stamp(4, -1))]);
        back.retain_present(&present);
        assert_eq!(back.text(), Done::line("b", stamp(4, -1)));
    }
}
