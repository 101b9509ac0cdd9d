"""Issue 36 items 1 and 4: nothing a container can write (or read) under ``/run`` chooses a decision.

Each attack runs in one private host view (tmpfs over ``/run``, ``/var/log`` and the key dir) with
real runc containers. Item 1, a uid-0 container with the host's ``/run`` read-write rewrites the
hook's own records in ``/run/oci-device-hook`` between two starts of a privileged pod: the first
design trusted them by ownership alone, so a rewritten compiled-settings entry (its key copied from
the record itself) switched the pod's policy to ``audit`` and it kept every GPU, and a rewritten
spec body in ``cdi-cache.json`` (its CRC fixed up) gave a pod allocated GPU 0 another device too.
Each record now carries the node key's seal (the settings entry also the settings file's digest):
the forged record is ignored, and the pod is narrowed as before the attack. The log never rotates a
host file the settings name. Item 4, a container with the host's ``/run`` read-only copied the
precreate marker's key from there and made a marker the prestart hook believed; the key is now the
node key, outside ``/run``, and the marker binds the container.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.live.livekit import Bundle, build_bundle, parse_probe, private_host
from tests.live.test_decider_attacks import runc_line
from tests.live.test_hook_scenarios import REPO, privileged, slice_pod

CACHE = "/run/oci-device-hook"
CDI = REPO / "examples" / "node" / "cdi"


def writer(bundle_dir: Path, script: str) -> Bundle:
    """A plain container (asks for nothing) with the host's /run read-write: it runs ``script``."""
    b = build_bundle(bundle_dir, ["/bin/sh", "-c", script])
    b.config["mounts"].append(
        {"destination": "/run", "type": "bind", "source": "/run", "options": ["rbind", "rw"]}
    )
    return b.write()


def in_view(lines: list[str], timeout: float = 120) -> str:
    proc = subprocess.run(
        private_host(["sh", "-c", "\n".join(lines)]),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return proc.stdout + proc.stderr


def default_cache_settings(host: dict[str, Path]) -> None:
    """A custom settings file (so the full path compiles it into fastpath.json) whose cache is the
    default one under /run, where a container with the host's /run can reach it."""
    host["settings"].write_text(f"log_file: {host['log']}\n")


def records(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def test_a_rewritten_settings_record_does_not_free_the_slice_pod(
    bundle_dir: Path, host: dict[str, Path], tmp_path: Path
) -> None:
    """The compiled settings in fastpath.json, rewritten in place to ``privileged_allocation:
    audit`` (the entry's key left as the hook wrote it): the second slice pod is still narrowed."""
    default_cache_settings(host)
    first, second = slice_pod(tmp_path / "first", host), slice_pod(bundle_dir, host)
    forge = (
        f'grep -q \'"privileged_allocation": "narrow"\' {CACHE}/fastpath.json && '
        f'sed -i \'s/"privileged_allocation": "narrow"/"privileged_allocation": "audit"/\' '
        f"{CACHE}/fastpath.json && grep -q '\"audit\"' {CACHE}/fastpath.json && echo FORGED"
    )
    attacker = writer(tmp_path / "attacker", forge)
    outs = [tmp_path / n for n in ("first.out", "attacker.out", "second.out")]
    text = in_view([runc_line(b, o) for b, o in zip((first, attacker, second), outs, strict=True)])
    print(text, *(o.read_text() for o in outs))
    assert "FORGED" in outs[1].read_text()  # the record was there, and the container rewrote it
    want = {"/dev/nvidia1": "ENXIO", "/dev/nvidia0": "ENOENT", "/tmp/n0": "EPERM"}
    assert parse_probe(outs[0].read_text()) == want
    assert parse_probe(outs[2].read_text()) == want, outs[2].read_text()
    assert [r["verdict"] for r in records(host["log"])] == ["apply", "apply"]


FORGER = r"""
import json, sys, zlib
path, out = sys.argv[1], sys.argv[2]
data = open(path, "rb").read()
lines = data.split(b"\n")
h = next(i for i, line in enumerate(lines) if line.startswith(b'{"magic"'))
header = json.loads(lines[h])
bodies = lines[h + 1 : h + 1 + len([v for v in header["files"].values() if "body" in v])]
order = sorted((v["body"][0], k) for k, v in header["files"].items() if "body" in v)
new, offset = [], 0
for (start, name), raw in zip(order, bodies):
    if name.endswith("nvidia.json"):
        spec = json.loads(raw)
        for dev in spec["devices"]:
            if dev["name"] == "0":
                dev["containerEdits"]["deviceNodes"].append(
                    {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1})
        raw = json.dumps(spec, separators=(",", ":")).encode()
    item = header["files"][name]
    crc = item["body"][2]
    if isinstance(crc, int):
        crc = zlib.crc32(raw)
    else:  # a plain digest: the best a writer without the key can do
        import hashlib
        crc = hashlib.blake2b(raw, digest_size=len(crc) // 2).hexdigest()
    item["body"] = [offset, len(raw), crc]
    new.append(raw)
    offset += len(raw) + 1
header["size"] = offset
lines[h] = json.dumps(header, separators=(",", ":")).encode()
out_data = b"\n".join(lines[: h + 1]) + b"\n" + b"".join(b + b"\n" for b in new)
open(out, "wb").write(out_data)
print("FORGER", len(out_data))
"""


def test_a_rewritten_cdi_cache_body_adds_no_device(
    bundle_dir: Path, host: dict[str, Path], tmp_path: Path
) -> None:
    """A spec body in cdi-cache.json rewritten to add GPU 1's node to GPU 0's device, its CRC fixed
    up: the next privileged pod allocated GPU 0 by CDI still cannot open GPU 1 (the issue's run
    added ``b 7:0`` the same way; a privileged pod keeps block devices, so GPU 1 shows it here)."""
    default_cache_settings(host)
    annotation = {"cdi.k8s.io/nvidia-device-plugin_x": "nvidia.com/gpu=0"}

    def pod(where: Path) -> Bundle:
        where.mkdir(exist_ok=True)
        b = privileged(
            where, host, [], ["/dev/nvidia0", "/dev/nvidia1", "/tmp/n1"], annotations=annotation,
            cdi=(CDI,), mknods=[("/tmp/n1", 195, 1)],
        )  # fmt: skip
        return b

    first, second = pod(tmp_path / "first"), pod(bundle_dir)
    attacker = writer(tmp_path / "attacker", f"cat /forged > {CACHE}/cdi-cache.json && echo FORGED")
    forger = " ".join(
        ["'" + sys.executable + "'", "-I", "-c", "'" + FORGER.replace("'", "'\\''") + "'",
         f"{CACHE}/cdi-cache.json", str(attacker.rootfs / "forged")]
    )  # fmt: skip
    outs = [tmp_path / n for n in ("first.out", "attacker.out", "second.out")]
    lines = [runc_line(first, outs[0]), forger, runc_line(attacker, outs[1]), runc_line(second, outs[2])]
    text = in_view(lines)
    print(text, *(o.read_text() for o in outs))
    assert "FORGER" in text and "FORGED" in outs[1].read_text()
    want = {"/dev/nvidia0": "ENXIO", "/dev/nvidia1": "ENOENT", "/tmp/n1": "EPERM"}
    assert parse_probe(outs[0].read_text()) == want, outs[0].read_text()
    assert parse_probe(outs[2].read_text()) == want, outs[2].read_text()


def test_the_log_never_rotates_a_file_the_hook_did_not_create(
    bundle_dir: Path, host: dict[str, Path], tmp_path: Path
) -> None:
    """Settings whose ``log_file`` names a host file past ``log_max_bytes`` (what the forged record
    did, here written by the operator): the slice pod is narrowed and started, the host file is
    not renamed to ``.1``, not replaced and not written."""
    victim = tmp_path / "victim"
    precious = "precious\n" * 600
    victim.write_text(precious)
    host["settings"].write_text(f"log_file: {victim}\nlog_max_bytes: 4096\n")
    pod, out = slice_pod(bundle_dir, host), tmp_path / "pod.out"
    text = in_view([runc_line(pod, out)])
    print(text, out.read_text())
    assert parse_probe(out.read_text()) == {
        "/dev/nvidia1": "ENXIO",
        "/dev/nvidia0": "ENOENT",
        "/tmp/n0": "EPERM",
    }
    assert victim.read_text() == precious and not Path(f"{victim}.1").exists()


# --- issue 36 item 4: the marker's key is not under /run, and a marker is one container's -------

MARKER_FORGER = r"""
import hashlib, hmac, json, sys
from pathlib import Path
from hook.adapters import marker
from hook.core.oci import parse_config_object
from hook.sources.settingsfile import load_settings
stolen, bundle, settings = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
key = stolen.read_bytes() if stolen.exists() else bytes(32)  # the best a reader of /run has
config = json.loads((bundle / "config.json").read_text())
parsed = parse_config_object(config, "config.json", str(bundle))
try:  # the scheme the first design used: HMAC-SHA256 over the nodes, rules and binding
    text = marker.digest_text(parsed, marker.binding(None, load_settings(settings)))
except Exception:
    text = b""
made = "v2:" + hmac.new(key, text, hashlib.sha256).hexdigest()
config.setdefault("annotations", {})[marker.ANNOTATION] = made
(bundle / "config.json").write_text(json.dumps(config))
print("MARKED", len(key))
"""


def test_a_marker_precomputed_from_what_run_holds_does_not_free_the_slice_pod(
    bundle_dir: Path, host: dict[str, Path], tmp_path: Path
) -> None:
    """A container with the host's /run read-only copies whatever key it finds there (the first
    design kept ``precreate.key`` in the cache dir); a marker made with it goes on the slice pod's
    config as a pod annotation would. The prestart hook still decides, and narrows it."""
    default_cache_settings(host)
    first = tmp_path / "first.json"
    first.write_text((REPO / "examples" / "slice-privileged" / "config.json").read_text())
    precreate = [sys.executable, "-I", "-m", "hook", "precreate", "--config", str(host["settings"]),
                 "--driver-root", str(host["root"]), "--cdi-spec-dir", str(host["no_cdi"])]  # fmt: skip
    thief = build_bundle(
        tmp_path / "thief",
        [
            "/bin/sh",
            "-c",
            f"for f in {CACHE}/*.key; do cat $f > /stolen.key && echo STOLE $f; done; echo LOOKED",
        ],
    )
    thief.config["mounts"].append(
        {"destination": "/run", "type": "bind", "source": "/run", "options": ["rbind", "ro"]}
    )
    thief.write()
    pod = slice_pod(bundle_dir, host)
    q = lambda a: "'" + a.replace("'", "'\\''") + "'"  # noqa: E731
    forge = [sys.executable, "-I", "-c", MARKER_FORGER, str(thief.rootfs / "stolen.key"), str(pod.path)]
    forge.append(str(host["settings"]))
    outs = [tmp_path / "thief.out", tmp_path / "pod.out"]
    lines = [
        " ".join(map(q, precreate)) + f" < {q(str(first))} > /dev/null",
        runc_line(thief, outs[0]),
        f"cd {q(str(REPO))} && " + " ".join(map(q, forge)),
        runc_line(pod, outs[1]),
    ]
    text = in_view(lines)
    print(text, *(o.read_text() for o in outs))
    assert "LOOKED" in outs[0].read_text() and "MARKED" in text
    want = {"/dev/nvidia1": "ENXIO", "/dev/nvidia0": "ENOENT", "/tmp/n0": "EPERM"}
    assert parse_probe(outs[1].read_text()) == want, outs[1].read_text()


def test_a_rewritten_env_requests_gives_a_pod_without_allocation_no_gpu(tmp_path: Path) -> None:
    """The issue's first exploit as it ran: a pod the kubelet allocated nothing, whose image asks
    for every GPU by env, starts twice; between the starts a container with the host's /run
    rewrites the compiled settings to ``env_requests: always``. The first design gave the second
    pod every GPU; now the rewritten record is ignored and it gets none."""
    from tests.bundles import checkpoint
    from tests.hosttree import make_host_tree
    from tests.k8s_shapes import write_cdi
    from tests.live.test_k8s_live import GPU_NODES, PLANTED, pod

    root = tmp_path / "driver-root"
    make_host_tree(root, "4x-k8s", mknod=True)
    node = {"root": root, "cdi": write_cdi(tmp_path / "cdi"), "tmp": tmp_path}
    first = pod(tmp_path / "first", node, ckpt=checkpoint([]))
    second = pod(tmp_path / "second", node, ckpt=checkpoint([]))  # the same settings bytes as the first
    forge = (
        f'grep -q \'"env_requests": "auto"\' {CACHE}/fastpath.json && '
        f'sed -i \'s/"env_requests": "auto"/"env_requests": "always"/\' {CACHE}/fastpath.json && '
        f"grep -q '\"always\"' {CACHE}/fastpath.json && echo FORGED"
    )
    attacker = writer(tmp_path / "attacker", forge)
    outs = [tmp_path / n for n in ("first.out", "attacker.out", "second.out")]
    text = in_view([runc_line(b, o) for b, o in zip((first, attacker, second), outs, strict=True)])
    print(text, *(o.read_text() for o in outs))
    assert "FORGED" in outs[1].read_text()
    for out in (outs[0], outs[2]):
        seen = parse_probe(out.read_text())
        assert {seen[p] for p in GPU_NODES} == {"ENOENT"}, seen
        assert {seen[p] for p in PLANTED} == {"EPERM"}, seen
