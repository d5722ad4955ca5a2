#!/usr/bin/env python3
"""Offline check of bulkcast's Kubernetes manifests.

No cluster is needed. kubeconform is not packaged for Debian and `kubectl --dry-run=client`
downloads the schema from a live API server, so this script checks the manifests against a
JSON Schema written down below: the subset of the Kubernetes API (v1.29+) these manifests use,
with the fields' names and types and the fields the API requires (unknown fields are
errors, so a misspelled key fails). Then it checks what a schema cannot: selectors match
their pod labels, every volume mount names a volume, every ConfigMap/Secret key the pods read
is one the documented commands create, and the `bulkcast` arguments name real flags of the
binary (`--help` of the binary given as argv[1], when given).

Needs python3-yaml and python3-jsonschema (Debian packages).
Usage: deploy/k8s/check.py [path/to/bulkcast]
"""
import glob
import os
import subprocess
import sys

import jsonschema
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))


def obj(props, required=(), extra=False):
    return {"type": "object", "properties": props, "required": list(required),
            "additionalProperties": extra}


STR = {"type": "string"}
INT = {"type": "integer"}
BOOL = {"type": "boolean"}
STRMAP = {"type": "object", "additionalProperties": STR}
PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
QTY = {"type": ["string", "integer"]}
META = obj({"name": STR, "namespace": STR, "labels": STRMAP, "annotations": STRMAP},
           ["name"])
TMPL_META = obj({"labels": STRMAP, "annotations": STRMAP}, ["labels"])
SECCOMP = obj({"type": {"enum": ["RuntimeDefault", "Localhost", "Unconfined"]}}, ["type"])
POD_SEC = obj({"runAsNonRoot": BOOL, "runAsUser": INT, "runAsGroup": INT, "fsGroup": INT,
               "seccompProfile": SECCOMP})
CTR_SEC = obj({"allowPrivilegeEscalation": BOOL, "readOnlyRootFilesystem": BOOL,
               "runAsNonRoot": BOOL,
               "capabilities": obj({"drop": {"type": "array", "items": STR},
                                    "add": {"type": "array", "items": STR}})})
PROBE = obj({"httpGet": obj({"path": STR, "port": {"type": ["integer", "string"]}},
                            ["port"]),
             "tcpSocket": obj({"port": {"type": ["integer", "string"]}}, ["port"]),
             "periodSeconds": INT, "initialDelaySeconds": INT, "failureThreshold": INT})
ENV = obj({"name": STR, "value": STR,
           "valueFrom": obj({"secretKeyRef": obj({"name": STR, "key": STR}, ["name", "key"]),
                             "configMapKeyRef": obj({"name": STR, "key": STR},
                                                    ["name", "key"])})},
          ["name"])
CONTAINER = obj({
    "name": STR, "image": STR,
    "command": {"type": "array", "items": STR}, "args": {"type": "array", "items": STR},
    "env": {"type": "array", "items": ENV},
    "ports": {"type": "array", "items": obj({"name": STR, "containerPort": PORT,
                                             "protocol": {"enum": ["TCP", "UDP", "SCTP"]}},
                                            ["containerPort"])},
    "readinessProbe": PROBE, "livenessProbe": PROBE,
    "resources": obj({"requests": {"type": "object", "additionalProperties": QTY},
                      "limits": {"type": "object", "additionalProperties": QTY}}),
    "securityContext": CTR_SEC,
    "volumeMounts": {"type": "array", "items": obj({"name": STR, "mountPath": STR,
                                                    "readOnly": BOOL},
                                                   ["name", "mountPath"])},
}, ["name", "image"])
VOLUME = obj({
    "name": STR,
    "configMap": obj({"name": STR, "defaultMode": INT}, ["name"]),
    "secret": obj({"secretName": STR, "defaultMode": INT}, ["secretName"]),
    "hostPath": obj({"path": STR, "type": {"enum": ["", "DirectoryOrCreate", "Directory",
                                                    "FileOrCreate", "File"]}}, ["path"]),
    "persistentVolumeClaim": obj({"claimName": STR, "readOnly": BOOL}, ["claimName"]),
    "emptyDir": {"type": "object"},
}, ["name"])
POD_SPEC = obj({
    "hostNetwork": BOOL, "dnsPolicy": STR, "automountServiceAccountToken": BOOL,
    "terminationGracePeriodSeconds": INT, "securityContext": POD_SEC,
    "restartPolicy": {"enum": ["Always", "OnFailure", "Never"]},
    "containers": {"type": "array", "items": CONTAINER, "minItems": 1},
    "volumes": {"type": "array", "items": VOLUME},
}, ["containers"])
TEMPLATE = obj({"metadata": TMPL_META, "spec": POD_SPEC}, ["metadata", "spec"])
SELECTOR = obj({"matchLabels": STRMAP}, ["matchLabels"])


def kind(api, k, spec=None, **top):
    props = {"apiVersion": {"const": api}, "kind": {"const": k}, "metadata": META, **top}
    req = ["apiVersion", "kind", "metadata"]
    if spec is not None:
        props["spec"] = spec
        req.append("spec")
    return obj(props, req)


SCHEMAS = {
    ("v1", "Namespace"): kind("v1", "Namespace"),
    ("v1", "ConfigMap"): kind("v1", "ConfigMap", data=STRMAP),
    ("v1", "Secret"): kind("v1", "Secret", type=STR, data=STRMAP, stringData=STRMAP),
    ("apps/v1", "DaemonSet"): kind("apps/v1", "DaemonSet", obj({
        "selector": SELECTOR, "template": TEMPLATE,
        "updateStrategy": obj({"type": {"enum": ["RollingUpdate", "OnDelete"]}})},
        ["selector", "template"])),
    ("batch/v1", "Job"): kind("batch/v1", "Job", obj({
        "backoffLimit": INT, "activeDeadlineSeconds": INT, "ttlSecondsAfterFinished": INT,
        "podFailurePolicy": obj({"rules": {"type": "array", "items": obj({
            "action": {"enum": ["FailJob", "Ignore", "Count", "FailIndex"]},
            "onExitCodes": obj({"containerName": STR, "operator": {"enum": ["In", "NotIn"]},
                                "values": {"type": "array", "items": INT}},
                               ["operator", "values"])}, ["action"])}}, ["rules"]),
        "template": TEMPLATE}, ["template"])),
}

# Made by the commands in bulkcast.yaml's header, not by a manifest.
CREATED_BY_HAND = {("Secret", "bulkcast-secret"): {"secret"},
                   ("ConfigMap", "bulkcast-hosts"): {"hosts.toml"}}


def check(docs, binary):
    errors = []
    configmaps = {d["metadata"]["name"]: set(d.get("data", {}))
                  for d in docs if d.get("kind") == "ConfigMap"}
    for d in docs:
        where = f'{d.get("kind")}/{d.get("metadata", {}).get("name")}'
        schema = SCHEMAS.get((d.get("apiVersion"), d.get("kind")))
        if schema is None:
            errors.append(f"{where}: no schema for {d.get('apiVersion')} {d.get('kind')}")
            continue
        for e in jsonschema.Draft202012Validator(schema).iter_errors(d):
            errors.append(f"{where}: {'/'.join(map(str, e.path))}: {e.message}")
        if "spec" not in d or "template" not in d["spec"]:
            continue
        spec, tmpl = d["spec"], d["spec"]["template"]
        sel = spec.get("selector", {}).get("matchLabels", {})
        labels = tmpl["metadata"].get("labels", {})
        if any(labels.get(k) != v for k, v in sel.items()):
            errors.append(f"{where}: selector {sel} does not match pod labels {labels}")
        pod = tmpl["spec"]
        if d["kind"] == "Job" and pod.get("restartPolicy") not in ("Never", "OnFailure"):
            errors.append(f"{where}: a Job's pods need restartPolicy Never or OnFailure")
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for c in pod["containers"]:
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes:
                    errors.append(f"{where}: mount {m['name']} names no volume")
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref and ref["key"] not in CREATED_BY_HAND.get(("Secret", ref["name"]), ()):
                    errors.append(f"{where}: secret {ref['name']} has no key {ref['key']}")
            if binary and c.get("args"):
                errors += check_args(where, c["args"], binary)
        for v in volumes.values():
            if "configMap" in v:
                name = v["configMap"]["name"]
                if name not in configmaps and ("ConfigMap", name) not in CREATED_BY_HAND:
                    errors.append(f"{where}: volume {v['name']}: no ConfigMap {name}")
            if "secret" in v and ("Secret", v["secret"]["secretName"]) not in CREATED_BY_HAND:
                errors.append(f"{where}: volume {v['name']}: unknown Secret")
    return errors


def check_args(where, args, binary):
    """Every --flag in a container's args is one the binary's subcommand takes."""
    out = subprocess.run([binary, args[0], "--help"], capture_output=True, text=True)
    if out.returncode != 0:
        return [f"{where}: `bulkcast {args[0]}` is not a command"]
    return [f"{where}: `bulkcast {args[0]}` has no {a}" for a in args[1:]
            if a.startswith("--") and f"{a} " not in out.stdout and f"{a}\n" not in out.stdout]


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else None
    docs = []
    for path in sorted(glob.glob(os.path.join(HERE, "*.yaml"))):
        with open(path) as f:
            docs += [d for d in yaml.safe_load_all(f) if d]
    errors = check(docs, binary)
    # The checker must catch what it claims to: a broken copy has to fail.
    broken = yaml.safe_load(yaml.safe_dump(docs))
    ds = next(d for d in broken if d["kind"] == "DaemonSet")
    ds["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    ds["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] = "other"
    if len(check(broken, None)) < 2:
        errors.append("the checker did not catch a misspelled key and a wrong selector")
    for e in errors:
        print("error:", e)
    print(f"{len(docs)} objects checked, {len(errors)} errors")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
