"""Stand-ins for the Kafka scripts compose/kafka/start calls, so that the fleet's broker script
runs here, on the jars of scripts/setup-kafka, outside Docker:

    kafka-storage.sh, kafka-server-start.sh      Kafka's own classes (StorageTool, kafka.Kafka)
    kafka-broker-api-versions.sh, kafka-configs.sh (SCRAM users), kafka-acls.sh (--add)
                                                 the same requests through the admin API

`write_bin(directory)` writes them; compose/kafka/start runs with KAFKA_BIN=directory.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from gpuflight import stack
from gpuflight.stack.kafka import KAFKA_JAVA_OPTS

_JAVA = '''#!/bin/sh
exec "{java}" {opts} -cp "{libs}/*" {main} "$@"
'''
_PYTHON = '''#!/bin/sh
cd "{repo}" && exec "{python}" -m tests.support.kafka_cli {tool} "$@"
'''


def write_bin(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    java, libs = stack.find_java(), stack.kafka_libs()
    repo = Path(__file__).resolve().parents[2]
    scripts = {
        "kafka-storage.sh": _JAVA.format(java=java, opts="-Xmx256m", libs=libs,
                                         main="kafka.tools.StorageTool"),
        "kafka-server-start.sh": _JAVA.format(java=java, opts=" ".join(KAFKA_JAVA_OPTS),
                                              libs=libs, main="kafka.Kafka"),
    }
    for tool in ("broker-api-versions", "configs", "acls"):
        scripts[f"kafka-{tool}.sh"] = _PYTHON.format(repo=repo, python=sys.executable,
                                                      tool=tool)
    for name, text in scripts.items():
        path = directory / name
        path.write_text(text)
        path.chmod(0o755)
    return directory


def _option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def main(argv: list[str]) -> int:
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    tool, args = argv[0], argv[1:]
    admin = AdminClient({"bootstrap.servers": _option(args, "--bootstrap-server")})
    if tool == "broker-api-versions":
        try:
            return 0 if admin.list_topics(timeout=2).brokers else 1
        except Exception:
            return 1
    if tool == "configs":
        assert _option(args, "--entity-type") == "users", args
        user = _option(args, "--entity-name")
        found = re.fullmatch(r"(SCRAM-SHA-(?:256|512))=\[iterations=(\d+),password=(.*)\]",
                             _option(args, "--add-config"))
        assert found is not None, args
        mechanism = ScramMechanism[found[1].replace("-", "_")]
        upsert = UserScramCredentialUpsertion(user, ScramCredentialInfo(mechanism,
                                                                        int(found[2])),
                                              found[3].encode())
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(timeout=30)
        return 0
    if tool == "acls":
        from tests.support.secure_kafka import acl_bindings

        assert args[2] == "--add", args
        for future in admin.create_acls(acl_bindings(args[3:]), request_timeout=30).values():
            future.result(timeout=40)
        return 0
    raise SystemExit(f"kafka_cli: unknown tool {tool}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
