"""grafana/: the files are what grafana/generate.py writes, valid against grafana-foundation-sdk's
models, name only the InfluxDB contract, and every query of every panel, annotation, variable
and alert rule returns the expected series and values from an InfluxDB the pipeline filled.

No Grafana runs here: tests/grafana_eval.py does what Grafana does with the files (variables,
$timeFilter, $__interval, reduce and threshold expressions, summary templates).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuflight.grafana import generate
from gpuflight.streams import measurements as m
from tests.conftest import REPO
from tests.support.grafana_eval import (
    Labels,
    contract_problems,
    render,
)

GRAFANA = REPO / "grafana"
DASHBOARD_FILES = sorted((GRAFANA / "dashboards").glob("*.json"))
ALERTING_FILE = GRAFANA / "provisioning" / "alerting" / "gpuflight.yaml"
DATASOURCE_FILE = GRAFANA / "provisioning" / "datasources" / "gpuflight.yaml"
DS = generate.DATASOURCE_UID


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in DASHBOARD_FILES}


def alerting() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(ALERTING_FILE.read_text())
    return loaded


def rules() -> dict[str, dict[str, Any]]:
    return {r["uid"]: r for g in alerting()["groups"] for r in g["rules"]}


def every_query() -> Iterator[tuple[str, str]]:
    """(where, InfluxQL) of every panel target, annotation, variable and alert query."""
    for name, board in dashboards().items():
        for p in board["panels"]:
            for t in p["targets"]:
                yield f"{name}/{p['title']}/{t['refId']}", t["query"]
        for a in board["annotations"]["list"]:
            if "target" in a:
                yield f"{name}/annotation {a['name']}", a["target"]["query"]
        for v in board["templating"]["list"]:
            if v["type"] == "query":  # not a textbox ($trace_url)
                yield f"{name}/${v['name']}", v["query"]
    for uid, r in rules().items():
        for item in r["data"]:
            if item["datasourceUid"] == DS:
                yield f"{uid}/{item['refId']}", item["model"]["query"]


# -- the files -------------------------------------------------------------------------------


def test_the_committed_files_are_what_the_generator_writes() -> None:
    files = generate.rendered()
    assert set(files) == {*DASHBOARD_FILES, ALERTING_FILE, DATASOURCE_FILE}
    for path, text in files.items():
        assert path.read_text() == text, f"{path} is stale: run python -m grafana.generate"
    assert generate.main(["--check"]) == 0


def test_the_provisioning_files_wire_the_datasource_dashboards_and_alerts() -> None:
    from gpuflight.streams.settings import DEFAULT_DATABASE

    (source,) = yaml.safe_load(DATASOURCE_FILE.read_text())["datasources"]
    assert source["uid"] == DS and source["type"] == "influxdb"
    assert source["url"] == "$GPUFLIGHT_INFLUX_URL"  # Grafana expands it at provisioning
    # It logs in (InfluxDB with auth-enabled); the password only from the environment, and
    # into secureJsonData, which Grafana keeps encrypted and never sends to a browser.
    assert source["user"] == "$GPUFLIGHT_INFLUX_USER"
    assert source["secureJsonData"] == {"password": "$GPUFLIGHT_INFLUX_PASSWORD"}
    assert "password" not in source and "password" not in source["jsonData"]
    assert source["jsonData"]["dbName"] == "gpuflight" == DEFAULT_DATABASE
    assert source["jsonData"]["version"] == "InfluxQL"
    assert source["jsonData"]["timeInterval"] == generate.WINDOW
    (provider,) = yaml.safe_load(
        (GRAFANA / "provisioning" / "dashboards" / "gpuflight.yaml").read_text())["providers"]
    assert provider["type"] == "file" and provider["folder"] == generate.FOLDER
    # compose mounts grafana/dashboards there
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards/gpuflight"
    files = alerting()
    (receiver,) = files["contactPoints"][0]["receivers"]
    assert receiver["settings"]["url"] == "$GPUFLIGHT_ALERT_WEBHOOK_URL"
    assert files["policies"][0]["receiver"] == files["contactPoints"][0]["name"]
    assert {r["title"] for r in rules().values()} == {
        "Memory-bound job", "Bandwidth anomaly", "Launch storm",
        "Events dropped by the pipeline", "Producer silent", "Route GPU cost per request doubled"}


def _sdk_units() -> set[str]:
    from grafana_foundation_sdk.models import units

    return {v for k, v in vars(units).items() if not k.startswith("_") and isinstance(v, str)}


def test_dashboards_are_a_fixed_point_of_the_sdk_models() -> None:
    from grafana_foundation_sdk.cog import runtime

    units = _sdk_units()
    for name, board in dashboards().items():
        # Decoded into the SDK's Dashboard and encoded again, nothing is lost or added.
        assert generate.through_sdk(board) == board, name
        assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
        for p in board["panels"]:
            assert runtime.panelcfg_config(p["type"]) is not None, p["type"]
            assert p["datasource"] == generate.DATASOURCE
            assert p["fieldConfig"]["defaults"]["unit"] in units, p["title"]
            for override in p["fieldConfig"]["overrides"]:
                for prop in override["properties"]:
                    assert prop["id"] != "unit" or prop["value"] in units
            for t in p["targets"]:
                assert set(t) <= {"refId", "datasource", "query", "rawQuery", "resultFormat",
                                  "alias"}
                assert t["rawQuery"] is True and t["resultFormat"] in {"time_series", "table"}
            grid = p["gridPos"]
            assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24
        names = [v["name"] for v in board["templating"]["list"]]
        assert names[0] == "host" and "job" in names


@pytest.mark.parametrize(("where", "key"), [
    (("panels", 0), "gridPosition"),                             # not a panel key
    (("panels", 0, "options"), "legnd"),                         # not a timeseries option
    (("panels", 0, "fieldConfig", "defaults"), "units"),         # not a field config key
    (("panels", 0, "fieldConfig", "defaults", "custom"), "lineWidht"),
    (("templating", "list", 0), "multiValue"),                   # not a variable key
])
def test_the_sdk_check_catches_what_grafana_would_not_know(where: tuple[Any, ...],
                                                           key: str) -> None:
    board = dashboards()["fleet"]
    node: Any = board
    for step in where:
        node = node[step]
    node[key] = 1
    assert generate.through_sdk(board) != board


def test_units_come_from_the_contract() -> None:
    job_board = dashboards()["job"]
    units = {p["title"]: p["fieldConfig"]["defaults"]["unit"] for p in job_board["panels"]}
    assert units["Live device memory"] == "bytes"  # memory.live_bytes: "bytes"
    assert units["Achieved bandwidth of synchronous copies"] == "Bps"
    assert units["GPU utilization (NVML)"] == "percent"
    assert set(generate.GRAFANA_UNITS) >= {f.unit for s in m.ALL.values() for f in s.fields}


def test_the_alerting_file_is_valid_for_the_sdk_models() -> None:
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import alerting as sdk
    from grafana_foundation_sdk.models import expr

    def through(model: Any, data: Mapping[str, Any]) -> Any:
        return json.loads(json.dumps(model.from_json(dict(data)), cls=JSONEncoder))

    files = alerting()
    assert files["apiVersion"] == 1
    (group,) = files["groups"]
    for r in group["rules"]:
        # The file's rule is the API's rule less the keys its group gives.
        api_rule = {**r, "folderUID": group["folder"], "orgID": group["orgId"],
                    "ruleGroup": group["name"]}
        assert through(sdk.Rule, api_rule) == json.loads(json.dumps(api_rule)), r["uid"]
        refs = [item["refId"] for item in r["data"]]
        assert len(set(refs)) == len(refs) and r["condition"] in refs
        for item in r["data"]:
            model = item["model"]
            if item["datasourceUid"] == "__expr__":
                kind = {"reduce": expr.TypeReduce, "threshold": expr.TypeThreshold,
                        "math": expr.TypeMath}
                assert through(kind[model["type"]], model) == model
                used = re.findall(r"\$(\w+)", model["expression"]) or [model["expression"]]
                assert set(used) <= set(refs[: refs.index(item["refId"])])
            else:
                assert item["datasourceUid"] == DS and model["datasource"]["uid"] == DS
    for point in files["contactPoints"]:
        for receiver in point["receivers"]:
            one = {"name": point["name"], **receiver}
            assert through(sdk.ContactPoint, one) == one
    for policy in files["policies"]:
        body = {k: v for k, v in policy.items() if k != "orgId"}
        assert through(sdk.NotificationPolicy, body) == body


def test_a_renamed_measurement_breaks_the_files(monkeypatch: pytest.MonkeyPatch) -> None:
    renamed = dataclasses.replace(m.LAUNCHES, name="kernel_launches")
    contract = {**m.ALL, renamed.name: renamed}
    del contract[m.LAUNCHES.name]
    problems = [p for _, q in every_query() for p in contract_problems(q, contract)[1]]
    assert "unknown measurement 'launches'" in problems
    monkeypatch.setattr(m, "LAUNCHES", renamed)
    stale = [p for p, text in generate.rendered().items() if p.read_text() != text]
    assert GRAFANA / "dashboards" / "fleet.json" in stale


# -- every panel against the pipeline's data -------------------------------------------------


UNFUSED, FUSED = "unfused", "fused"


# -- alert rules against the pipeline's data -------------------------------------------------


def summary(uid: str, evaluation: Any, labels: Labels) -> str:
    return render(rules()[uid]["annotations"]["summary"], labels,
                  evaluation.values_for(labels))


# -- alert rules on scenarios the demo does not play -----------------------------------------


def test_the_generator_checks_and_says_what_is_stale(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(generate, "ROOT", tmp_path / "grafana")
    monkeypatch.setattr(generate, "DASHBOARD_DIR", tmp_path / "grafana" / "dashboards")
    monkeypatch.setattr(generate, "ALERTING_FILE", tmp_path / "grafana" / "alerting.yaml")
    assert generate.main(["--check"]) == 1
    assert "stale: grafana/dashboards/fleet.json" in capsys.readouterr().err
    assert generate.main([]) == 0
    assert generate.main(["--check"]) == 0
