//! `bulkcast plan --hosts FILE` with `ssh = "user@host[:port]"` hosts in the file: one-shot
//! agents are started over a real sshd for the probe, as `send` starts them, and stopped
//! after it.

// Not every helper in `common` is used here.
#[allow(dead_code, unused_imports)]
mod common;

#[test]
#[cfg_attr(
    not(bulkcast_sshd),
    ignore = "needs Debian's openssh-server (apt-get install openssh-server), not found when built"
)]
fn plan_probes_ssh_hosts_through_one_shot_agents_and_leaves_none_behind() {
    #[cfg(bulkcast_sshd)]
    {
        use common::{secret, spawn_agent, Scratch, Sshd};
        use std::process::Command;
        const BIN: &str = env!("CARGO_BIN_EXE_bulkcast");

        let s = Scratch::new("plan-ssh");
        let sshd = Sshd::start(&s.0, "");
        let user = Sshd::user();
        let key = secret(0x5f);
        let running = spawn_agent(&s.0.join("running"), &["127.0.0.1:0"], |c| {
            c.env("BULKCAST_SECRET", &key);
        });
        // The port comes from the hosts file.
        let ssh_args = sshd.ssh_args.replacen(&format!("-p {} ", sshd.port), "", 1);
        let d = s.0.display();
        let hosts = s.0.join("hosts.toml");
        std::fs::write(
            &hosts,
            format!(
                "[[host]]\nname = \"running\"\naddr = \"{}\"\n\
                 [[host]]\nname = \"one\"\nssh = \"{user}@127.0.0.1:{p}\"\n\
                 [[host]]\nname = \"two\"\nssh = \"{user}@127.0.0.2:{p}\"\n",
                running.addr,
                p = sshd.port
            ),
        )
        .unwrap();
        let out = Command::new(BIN)
            .args(["plan", "--samples", "2", "--hosts"])
            .arg(&hosts)
            .args(["--ssh-args", &ssh_args, "--ssh-bulkcast", BIN])
            .arg("--ssh-dir")
            .arg(format!("{d}/rx-{{host}}"))
            .arg("--out")
            .arg(s.0.join("p"))
            .env("BULKCAST_SECRET", &key)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        // The source and three agents, every pair probed: the ssh hosts answered.
        assert!(err.contains("probed all 6 pairs of 4 nodes"), "{err}");
        for name in ["running", "one", "two"] {
            assert!(text.contains(name), "{name} missing from\n{text}");
        }
        assert!(s.0.join("p.svg").is_file());
        common::assert_none_left(&format!("{d}/rx-"));
    }
}
