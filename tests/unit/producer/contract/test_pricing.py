"""producer/contract/pricing.py: GPU-seconds into USD and cost rollups, checked by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuflight.producer.contract.errors import UsageError
from gpuflight.producer.contract.pricing import (
    NO_LABEL,
    CostItem,
    PriceBook,
    rollup,
    unpriced_models,
)
from tests.conftest import REPO, one_line

DEFAULTS = REPO / "producer" / "contract" / "prices.toml"


@pytest.fixture
def book(tmp_path: Path) -> PriceBook:
    path = tmp_path / "prices.toml"
    path.write_text('[usd_per_gpu_hour]\n"H100" = 3.0\n"L4" = 0.72\n"A100" = 1.2\n'
                    '"A100 80GB" = 1.8\n')
    return PriceBook.load(path)


@pytest.mark.parametrize(("name", "model"), [
    ("NVIDIA H100 80GB HBM3", "H100"),
    ("NVIDIA H100 NVL", "H100"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
    ("NVIDIA A100-PCIE-40GB", "A100"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", None),  # not an L4
    ("Tesla T4", None),
])
def test_models_match_nvml_names(book: PriceBook, name: str, model: str | None) -> None:
    assert book.model_of(name) == model


@pytest.mark.parametrize(("name", "model"), [
    ("NVIDIA H200", "H200"), ("NVIDIA GH200 480GB", "GH200"), ("NVIDIA A10G", "A10G"),
    ("NVIDIA A10", "A10"), ("NVIDIA L40S", "L40S"), ("NVIDIA L40", "L40"), ("Tesla T4", "T4"),
    ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"), ("NVIDIA RTX A6000", "RTX A6000"),
    ("Tesla V100-SXM2-16GB", "V100"), ("NVIDIA B200", "B200"), ("NVIDIA H100 PCIe", "H100"),
])
def test_the_default_price_file_covers_the_common_data_centre_gpus(name: str, model: str) -> None:
    defaults = PriceBook.load(DEFAULTS)
    assert defaults.model_of(name) == model
    assert defaults.per_hour("NVIDIA H100 80GB HBM3") == 3.0


def test_a_users_file_overrides_the_defaults_model_by_model(tmp_path: Path) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text('[usd_per_gpu_hour]\n"H100" = 2.25\n"Custom X9" = 9\n')
    merged = PriceBook.load(DEFAULTS, mine)
    assert merged.per_hour("NVIDIA H100 80GB HBM3") == 2.25
    assert merged.per_hour("NVIDIA L4") == 0.70
    assert merged.per_hour("Acme Custom X9 Pro") == 9.0


@pytest.mark.parametrize(("text", "message"), [
    ("[usd_per_gpu_hour\n", "not valid TOML"),
    ('[prices]\n"H100" = 3\n', "no [usd_per_gpu_hour] table"),
    ('[usd_per_gpu_hour]\n"H100" = "three"\n', "must be a number"),
    ('[usd_per_gpu_hour]\n"H100" = -1\n', "must be a number"),
    ('[usd_per_gpu_hour]\n"H100" = true\n', "must be a number"),
    ('[usd_per_gpu_hour]\n"H100" = nan\n', "must be a number >= 0 and finite"),
    ('[usd_per_gpu_hour]\n"H100" = inf\n', "must be a number >= 0 and finite"),
    ('[usd_per_gpu_hour]\n"H100" = 1e999\n', "must be a number >= 0 and finite"),
    (f'[usd_per_gpu_hour]\n"H100" = {"9" * 400}\n', "must be a number >= 0 and finite"),
])
def test_bad_price_files_are_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(UsageError) as error:
        PriceBook.load(path)
    assert message in one_line(error)
    with pytest.raises(UsageError, match="cannot read"):
        PriceBook.load(tmp_path / "absent.toml")


def test_rollups_by_hand(book: PriceBook) -> None:
    items = [
        # route /generate on an H100 at 3.0 USD/h: 1.2 s + 0.6 s = 1.8 s -> 0.0015 USD
        CostItem(1.2, "NVIDIA H100 80GB HBM3", {"route": "/generate", "job": "k8s:ml/llm-0",
                                                "namespace": "ml", "team": "search"}),
        CostItem(0.6, "NVIDIA H100 80GB HBM3", {"route": "/generate", "job": "k8s:ml/llm-1",
                                                "namespace": "ml", "team": "search"}),
        # route /embed on an L4 at 0.72 USD/h: 10 s -> 0.002 USD
        CostItem(10.0, "NVIDIA L4", {"route": "/embed", "job": "k8s:ml/emb-0", "namespace": "ml",
                                     "team": "ads"}),
        # SLURM work with no request: 360 s on an A100 80GB at 1.8 USD/h -> 0.18 USD
        CostItem(360.0, "NVIDIA A100-SXM4-80GB", {"job": "slurm:77", "slurm_account": "physics"},
                 requests=0),
        # a GPU with no price: counted apart
        CostItem(5.0, "Tesla T4", {"route": "/embed", "team": "ads"}),
    ]
    by_route = {r.key: r for r in rollup(items, book, "route")}
    generate, embed, none = by_route[("/generate",)], by_route[("/embed",)], by_route[(NO_LABEL,)]
    assert generate.requests == 2 and generate.gpu_seconds == pytest.approx(1.8)
    assert generate.cost_usd == pytest.approx(0.0015)
    assert generate.cost_per_1k_requests == pytest.approx(0.75)
    assert (embed.requests, embed.unpriced_gpu_seconds) == (2, 5.0)
    assert embed.cost_usd == pytest.approx(0.002)
    assert embed.cost_per_request == pytest.approx(0.001)
    assert (none.requests, none.cost_per_request) == (0, None)
    assert none.cost_usd == pytest.approx(0.18)
    assert [r.key for r in rollup(items, book, "route")] == [
        (NO_LABEL,), ("/embed",), ("/generate",)]  # costliest first
    by_team = {r.key: r.cost_usd for r in rollup(items, book, "team")}
    assert by_team == {("search",): pytest.approx(0.0015), ("ads",): pytest.approx(0.002),
                       (NO_LABEL,): pytest.approx(0.18)}
    by_account = {r.key: r.cost_usd for r in rollup(items, book, "slurm_account")}
    assert by_account[("physics",)] == pytest.approx(0.18)
    by_ns_team = {r.key: r.requests for r in rollup(items, book, ("namespace", "team"))}
    assert by_ns_team == {("ml", "search"): 2, ("ml", "ads"): 1, (NO_LABEL, NO_LABEL): 0,
                          (NO_LABEL, "ads"): 1}
    by_job = {r.key: r.gpu_seconds for r in rollup(items, book, "job")}
    assert by_job[("k8s:ml/llm-0",)] == pytest.approx(1.2)
    assert generate.cost_per_hour(60.0) == pytest.approx(0.0015 * 60)
    assert unpriced_models(items, book) == {"Tesla T4"}
    assert book.cost(3600.0, "NVIDIA H100 80GB HBM3") == pytest.approx(3.0)
    assert book.cost(1.0, "Tesla T4") is None
