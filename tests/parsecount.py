"""Run the live hook in-process; count its config.json reads and decodes: ``parsecount.py LIB OUT -- ARGS``.

Rule: as ``bench/hookproc.py`` (the launcher's flags, ``LIB`` first on ``sys.path``, ``hook.entry.main``
with the OCI state on fd 0), with an audit hook counting every ``open`` of a ``config.json`` and the
JSON decoders (the fast path's ``loads``, the core's ``load_json_object``) and ``parse_config_object``
wrapped to count the calls that decode or parse config.json. One JSON line goes to ``OUT``.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    lib, out, rest = argv[0], argv[1], argv[2:]
    sys.path.insert(0, lib)
    counts = {"opens": 0, "decodes": 0, "parses": 0}

    def audit(event: str, args: tuple[object, ...]) -> None:
        if event == "open" and isinstance(args[0], (str, bytes)) and str(args[0]).endswith("config.json"):
            counts["opens"] += 1

    def is_config(data: object) -> bool:
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        return isinstance(text, str) and '"process"' in text

    from hook.sources import privatefile

    real_loads = privatefile.loads

    def loads(data: bytes) -> object:
        counts["decodes"] += is_config(data)
        return real_loads(data)

    privatefile.loads = loads  # before hook.routes.fastpath imports it by name
    from hook.core import oci

    real_load, real_parse = oci.load_json_object, oci.parse_config_object

    def load_json_object(data: bytes, source: str, limit: int) -> object:
        counts["decodes"] += is_config(data)
        return real_load(data, source, limit)

    def parse_config_object(obj: object, source: str, bundle: str) -> object:
        counts["parses"] += source.endswith("config.json")
        return real_parse(obj, source, bundle)  # type: ignore[arg-type]

    oci.load_json_object = load_json_object  # type: ignore[assignment]
    oci.parse_config_object = parse_config_object  # type: ignore[assignment]
    sys.addaudithook(audit)
    from hook.entry import main as hook_main

    rc = hook_main(rest[1:])
    import json

    with open(out, "a") as f:
        f.write(json.dumps({"rc": rc, **counts}) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
