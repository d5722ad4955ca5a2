//! The library API: what `bulkcast send` and `bulkcast agent` do, from a Rust program.
//!
//! - [`Send`]: a builder for a send to agents (hosts, input, strategy, options), run with a
//!   shutdown future; returns the same [`Report`](crate::report::Report) as
//!   `bulkcast send --json`. It makes every decision `bulkcast send` makes: `auto`'s strategy,
//!   the chunk size, the plan over probed (or cached, or given) round trips, which receivers
//!   to leave out, retries; [`Event`]s say what it decided, and the CLI prints them.
//! - [`Agent`]: a receiving agent inside another tokio program: bound, then served until a
//!   shutdown future completes.
//! - [`plan_push`]: the planner over measured round trips, which `send`'s planned strategies
//!   use; [`load_hosts`] reads `--to`'s hosts (a list or a hosts file).
//!
//! Two agents and a send in one program, on loopback:
//!
//! ```
//! use bulkcast_runtime::{Agent, Send, Strategy};
//! use bulkcast_proto::auth::Secret;
//!
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let secret = Secret::from_bytes([7; 32]);
//! let scratch = std::env::temp_dir().join(format!("bulkcast-doc-{}", std::process::id()));
//! let file = scratch.join("weights.bin");
//! std::fs::create_dir_all(&scratch)?;
//! std::fs::write(&file, vec![42u8; 3 << 20])?;
//!
//! // Two agents, each storing into its own directory, served until `stop` fires.
//! let (stop, stopped) = tokio::sync::watch::channel(());
//! let mut addrs = Vec::new();
//! for i in 0..2 {
//!     let agent = Agent::new(scratch.join(format!("rx{i}")), &secret)
//!         .listen("127.0.0.1:0")
//!         .bind()
//!         .await?;
//!     addrs.push(agent.local_addrs()[0].to_string());
//!     let mut stopped = stopped.clone();
//!     tokio::spawn(agent.run(async move { let _ = stopped.changed().await; }));
//! }
//!
//! // A chain: source -> rx0 -> rx1.
//! let report = Send::to_list(&addrs.join(","))?
//!     .secret(&secret)
//!     .file(&file)
//!     .strategy(Strategy::Tree { fanout: 1 })
//!     .run(std::future::pending())
//!     .await?;
//! assert!(report.ok);
//! assert_eq!(std::fs::read(scratch.join("rx1/weights.bin"))?, std::fs::read(&file)?);
//! let _ = stop.send(());
//! # std::fs::remove_dir_all(&scratch)?;
//! # Ok(())
//! # }
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use bulkcast_proto::auth::{Keys, Secret};
use bulkcast_proto::wire::SessionId;

use crate::agent::AgentConfig;
use crate::transport::{self, Listener};

mod plan;
mod send;
mod session;

pub use plan::{
    auto_note, choose_auto, load_hosts, plan_push, plan_push_with, read_matrix, send_shape, sites,
    AutoChoice, PlannedPush, PushPlanning,
};
pub use send::{Error, Event, Object, Send, Strategy};
pub use session::{admitted, Admitted};

/// A receiving agent in this program, configured step by step, then [`Agent::bind`]ed.
pub struct Agent {
    cfg: AgentConfig,
    listen: Vec<String>,
    once: bool,
}

/// An [`Agent`] listening, ready to [`BoundAgent::run`].
pub struct BoundAgent {
    cfg: Arc<AgentConfig>,
    listeners: Vec<Listener>,
    addrs: Vec<SocketAddr>,
    once: bool,
}

impl Agent {
    /// An agent storing into `dir`, admitting those who hold `secret`.
    pub fn new(dir: impl Into<PathBuf>, secret: &Secret) -> Agent {
        Agent::with_keys(dir, Keys::derive(secret))
    }

    /// An agent storing into `dir` with these keys (host keys, plaintext).
    pub fn with_keys(dir: impl Into<PathBuf>, keys: Keys) -> Agent {
        Agent {
            cfg: AgentConfig::new(dir.into(), keys),
            listen: Vec::new(),
            once: false,
        }
    }

    /// An address to listen on (TCP and the paced UDP transport); repeatable. Default:
    /// `0.0.0.0:7400`.
    pub fn listen(mut self, addr: &str) -> Agent {
        self.listen.push(addr.into());
        self
    }

    /// Ends after the first object received (or session failed), as `agent --once`.
    pub fn once(mut self, once: bool) -> Agent {
        self.once = once;
        self
    }

    /// The full settings, for what the builder does not name.
    pub fn config_mut(&mut self) -> &mut AgentConfig {
        &mut self.cfg
    }

    /// Creates the directory and listens.
    pub async fn bind(self) -> std::io::Result<BoundAgent> {
        std::fs::create_dir_all(&self.cfg.dir)?;
        let listen = if self.listen.is_empty() {
            vec!["0.0.0.0:7400".to_string()]
        } else {
            self.listen
        };
        let (mut listeners, mut addrs) = (Vec::new(), Vec::new());
        for a in &listen {
            let ls = transport::listen_both(a, &self.cfg.tuning).await?;
            addrs.push(ls[0].local_addr()?);
            listeners.extend(ls);
        }
        Ok(BoundAgent {
            cfg: Arc::new(self.cfg),
            listeners,
            addrs,
            once: self.once,
        })
    }
}

impl BoundAgent {
    /// Where it listens (one per address given; TCP and UDP share each port).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The sessions it is part of, running and finished (as `agent --web` shows them).
    pub fn sessions(&self) -> crate::live::Sessions {
        self.cfg.live.clone()
    }

    /// Serves until `shutdown` completes (`None`), or with [`Agent::once`] until the first
    /// object is received or a session fails (that outcome).
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Option<Result<SessionId, crate::agent::SessionError>> {
        crate::agent::serve(self.listeners, self.cfg, self.once, shutdown).await
    }
}
