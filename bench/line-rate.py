#!/usr/bin/env python3
"""Summarises a bench/line-rate run: one row per scenario, each method's per-receiver rate as
a fraction of the link (object size over the time until the last receiver had its copy), and
bulkcast's lead over the best other method that copies the object to every receiver."""
import argparse
import datetime
import json
import pathlib
import re

COLUMNS = ["iperf3", "nc-chain", "uftp", "aria2", "bulkcast-default"]
PEERS = ["nc-chain", "uftp", "aria2"]


def fraction(doc, r):
    if r.get("last_s") is None or not doc.get("ideal_bps"):
        return None
    if r.get("verified") is False:
        return None
    return doc["size"] * 8 / r["last_s"] / doc["ideal_bps"]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("dir")
    ap.add_argument("--commit", default="unknown")
    a = ap.parse_args()
    rows = []
    for p in sorted(pathlib.Path(a.dir).glob("*.json")):
        doc = json.loads(p.read_text())
        got = {r["method"]: fraction(doc, r) for r in doc["results"]}
        n = len([h for h in doc["hosts"] if h["name"] != doc["source"]])
        peers = [got.get(m) for m in PEERS if got.get(m) is not None]
        best = max(peers) if peers else None
        bc = got.get("bulkcast-default")
        lead = f"{bc / best:.3f}" if bc and best else "-"
        cells = [f"{got[m]:.3f}" if got.get(m) is not None else "-" for m in COLUMNS]
        rows.append((doc["scenario"], n, doc["size"] >> 20, cells, lead))
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    print(f"Line rate on stars, {date}, commit {a.commit} (`bench/line-rate`): per-receiver rate / "
          "link rate, time from the start of each method (bulkcast: `send`, probing included) "
          "until the last receiver had a verified copy; iperf3 is one stream to one receiver "
          "(bbr), no copy kept.\n")
    print("| scenario | N | MiB | " + " | ".join(COLUMNS) + " | bulkcast / best peer |")
    print("|---|---|---|" + "---|" * len(COLUMNS) + "---|")
    def order(row):
        rtt = re.search(r"rtt(\d+)", row[0])
        return (int(rtt.group(1)) if rtt else 0, row[1], "loss" in row[0])

    for name, n, mib, cells, lead in sorted(rows, key=order):
        print(f"| {name} | {n} | {mib} | " + " | ".join(cells) + f" | {lead} |")


if __name__ == "__main__":
    main()
