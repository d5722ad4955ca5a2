#!/bin/bash
# Checks the deployment files offline against a built binary:
#   deploy/check.sh [path/to/bulkcast]     (default: target/release/bulkcast, then debug)
# - the systemd unit: `systemd-analyze verify` (no warning allowed) and an exposure level of
#   at most 2.0 in `systemd-analyze security --offline=yes`;
# - the Kubernetes manifests: `kubernetes-validate --strict` (PyPI, pinned; it ships the API's
#   JSON schemas, so it runs offline; installed once in a venv under $CARGO_TARGET_DIR or
#   target/) against the oldest API version the manifests claim and the newest it knows,
#   then deploy/k8s/check.py (cross references a schema cannot see; no cluster);
# - the Slurm recipe: run for real on this host with a stand-in `srun` that starts its tasks
#   here, each in its own directory (3 "nodes" over loopback, copies compared);
# - the example agent config and the man pages and completions the binary generates.
# Needs systemd (systemd-analyze), python3 with venv, python3-yaml, python3-jsonschema. Exits
# non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-}
if [ -z "$BIN" ]; then
    for b in target/release/bulkcast target/debug/bulkcast; do [ -x "$b" ] && BIN=$b && break; done
fi
[ -x "$BIN" ] || { echo "no bulkcast binary: give its path" >&2; exit 2; }
BIN=$(realpath "$BIN")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

echo "== systemd unit"
command -v systemd-analyze >/dev/null || { echo "systemd-analyze missing (apt-get install systemd)" >&2; exit 2; }
sed "s#/usr/local/bin/bulkcast#$BIN#" deploy/systemd/bulkcast-agent.service > "$T/bulkcast-agent.service"
# The man page is installed apart (`bulkcast man --dir`), so verify does not look for it.
out=$(systemd-analyze verify --man=no "$T/bulkcast-agent.service" 2>&1) || { echo "$out"; exit 1; }
[ -z "$out" ] || { echo "$out"; echo "systemd-analyze verify warned" >&2; exit 1; }
exposure=$(systemd-analyze security --offline=yes "$T/bulkcast-agent.service" 2>&1 \
    | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
echo "exposure level: $exposure"
python3 -c "import sys; sys.exit(0 if float('$exposure') <= 2.0 else 1)" \
    || { echo "exposure above 2.0" >&2; exit 1; }
# The unit's config parses, with the flag the unit adds.
"$BIN" secret > "$T/secret"
sed "s#/var/lib/bulkcast#$T/agent-dir#; s#0.0.0.0:7400#127.0.0.1:0#; s#127.0.0.1:9740#127.0.0.1:0#" \
    deploy/systemd/agent.toml > "$T/agent.toml"
timeout 3 "$BIN" agent --config "$T/agent.toml" --secret-file "$T/secret" > "$T/agent.out" || true
grep -q "listening on" "$T/agent.out" && grep -q "metrics on" "$T/agent.out" \
    || { cat "$T/agent.out"; echo "the example config does not start an agent" >&2; exit 1; }

echo "== Kubernetes manifests"
KV_VERSION=1.37.0
VENV=${CARGO_TARGET_DIR:-$PWD/target}/k8s-venv
if ! "$VENV/bin/kubernetes-validate" --version 2>/dev/null | grep -q "$KV_VERSION"; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "kubernetes-validate==$KV_VERSION"
fi
# --strict: a field the API does not know (a misspelled key) fails, as a missing one does.
for k in 1.29.0 1.37.0; do
    "$VENV/bin/kubernetes-validate" --strict --quiet -k "$k" deploy/k8s/*.yaml
done
echo "schemas of Kubernetes 1.29 and 1.37: valid (strict)"
python3 deploy/k8s/check.py "$BIN"

echo "== Slurm recipe (3 stand-in nodes on this host)"
mkdir -p "$T/bin" "$T/nodes"
cat > "$T/bin/srun" <<'SRUN'
#!/bin/bash
# Stand-in for srun: --ntasks=N runs the command N times here, task i in $NODES/node$i.
n=1; while [[ $1 == --* ]]; do [[ $1 == --ntasks=* ]] && n=${1#--ntasks=}; shift; done
pids=(); for i in $(seq "$n"); do
  mkdir -p "$NODES/node$i"; (cd "$NODES/node$i" && exec "$@") & pids+=($!)
done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done; exit $rc
SRUN
chmod +x "$T/bin/srun"
head -c 5000000 /dev/urandom > "$T/data.bin"
NODES="$T/nodes" PATH="$T/bin:$PATH" BULKCAST="$BIN" SLURM_JOB_NUM_NODES=3 SLURM_JOB_ID=1 \
    timeout 120 bash deploy/slurm/stage.sbatch "$T/data.bin" copy.bin
for i in 1 2 3; do cmp "$T/data.bin" "$T/nodes/node$i/copy.bin"; done
echo "3 copies verified and equal"

echo "== man pages and completions"
"$BIN" man --dir "$T/man" && [ -s "$T/man/bulkcast-send.1" ]
for sh in bash zsh fish; do "$BIN" completions $sh > "$T/c.$sh" && grep -q strategy "$T/c.$sh"; done
echo "all deployment checks passed"
