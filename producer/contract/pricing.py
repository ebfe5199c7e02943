"""GPU-seconds into money, and cost rollups by route, job, namespace, team or SLURM account.

A price book maps GPU models to USD per GPU-hour (prices.toml, beside this module, holds
illustrative defaults: `DEFAULT_PRICES`; a user's file overrides them model by model). A GPU
matches the model whose words all
appear in its NVML name, the most specific model first ("A100 80GB" before "A100"), so "NVIDIA
A100-SXM4-80GB" and "NVIDIA H100 80GB HBM3" need no entry of their own.

The rollups are pure functions over `CostItem`s: the GPU-seconds of one request (or of one
process's unattributed work) with its GPU model and its labels (route, job, namespace, team, a
SLURM account, ...). The entry point decides which price files are read over the defaults.
"""

from __future__ import annotations

import importlib.resources
import math
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from gpuflight.producer.contract.errors import UsageError
from gpuflight.producer.contract.files import read_input

SECTION: Final = "usd_per_gpu_hour"
#: The label value of items that do not carry the label rolled up by.
NO_LABEL: Final = "(none)"
_VENDOR_WORDS: Final = frozenset({"NVIDIA", "TESLA", "GEFORCE"})
#: gpuflight's default price list (illustrative), shipped beside this module.
DEFAULT_PRICES: Final = Path(str(importlib.resources.files("gpuflight.producer.contract")
                                 / "prices.toml"))


def _words(name: str) -> frozenset[str]:
    return frozenset(re.split(r"[\s\-_/]+", name.upper().strip())) - _VENDOR_WORDS - {""}


def _usd(price: object) -> float | None:
    """A price as a float, or None unless a finite number >= 0 (TOML has nan, inf, and
    integers beyond a float's range)."""
    if isinstance(price, bool) or not isinstance(price, int | float):
        return None
    try:
        usd = float(price)
    except OverflowError:
        return None
    return usd if 0 <= usd < math.inf else None


@dataclass(frozen=True)
class PriceBook:
    """USD per GPU-hour by GPU model."""

    prices: Mapping[str, float]
    sources: tuple[Path, ...] = ()
    _models: tuple[tuple[frozenset[str], str], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        models = sorted(((_words(m), m) for m in self.prices),
                        key=lambda wm: (-len(wm[0]), -len(wm[1]), wm[1]))
        object.__setattr__(self, "_models", tuple(models))

    @classmethod
    def load(cls, *paths: Path) -> PriceBook:
        """Read price files; each later file overrides the earlier ones, model by model."""
        prices: dict[str, float] = {}
        for path in paths:
            try:  # a regular file: a FIFO or a device is refused, never waited on
                data = tomllib.loads(read_input(path, "price file").decode())
            except UnicodeDecodeError:
                raise UsageError(f"price file {path} is not text") from None
            except tomllib.TOMLDecodeError as exc:
                raise UsageError(f"price file {path} is not valid TOML: {exc}") from exc
            table = data.get(SECTION)
            if not isinstance(table, dict):
                raise UsageError(f"price file {path} has no [{SECTION}] table")
            for model, price in table.items():
                usd = _usd(price)
                if usd is None:
                    raise UsageError(f"price file {path}: {model!r} must be a number >= 0 and "
                                     f"finite (USD per GPU-hour), not {price!r}")
                prices[model] = usd
        return cls(prices, tuple(paths))

    def model_of(self, gpu_name: str) -> str | None:
        """The priced model a GPU (by its NVML name) is, or None."""
        words = _words(gpu_name)
        for model_words, model in self._models:
            if model_words and model_words <= words:
                return model
        return None

    def per_hour(self, gpu_name: str) -> float | None:
        model = self.model_of(gpu_name)
        return None if model is None else self.prices[model]

    def cost(self, gpu_seconds: float, gpu_name: str) -> float | None:
        """USD for `gpu_seconds` on that GPU, or None when its model has no price."""
        price = self.per_hour(gpu_name)
        return None if price is None else gpu_seconds * price / 3600.0


@dataclass(frozen=True)
class CostItem:
    """GPU-seconds of one request (requests=1) or of work no request explains (requests=0)."""

    gpu_seconds: float
    gpu_name: str
    labels: Mapping[str, str]
    requests: int = 1


@dataclass(frozen=True)
class CostRow:
    key: tuple[str, ...]
    requests: int
    gpu_seconds: float
    cost_usd: float
    #: GPU-seconds on GPUs with no price (not in cost_usd).
    unpriced_gpu_seconds: float

    @property
    def cost_per_request(self) -> float | None:
        return self.cost_usd / self.requests if self.requests else None

    @property
    def cost_per_1k_requests(self) -> float | None:
        per = self.cost_per_request
        return None if per is None else per * 1000.0

    def cost_per_hour(self, window_seconds: float) -> float:
        """The rate of spend over a window of that length."""
        return self.cost_usd * 3600.0 / window_seconds if window_seconds > 0 else 0.0


def rollup(items: Iterable[CostItem], prices: PriceBook, by: str | Sequence[str]) -> list[CostRow]:
    """Sum requests, GPU-seconds and cost per value of the label(s) `by`, costliest first.

    `by` may be "request_id", "route", "job", "namespace", a pod label such as "team",
    "slurm_account", or several of them; an item without the label counts under NO_LABEL."""
    keys = (by,) if isinstance(by, str) else tuple(by)
    sums: dict[tuple[str, ...], list[float]] = {}
    for item in items:
        key = tuple(item.labels.get(k, NO_LABEL) or NO_LABEL for k in keys)
        row = sums.setdefault(key, [0, 0.0, 0.0, 0.0])
        row[0] += item.requests
        row[1] += item.gpu_seconds
        cost = prices.cost(item.gpu_seconds, item.gpu_name)
        if cost is None:
            row[3] += item.gpu_seconds
        else:
            row[2] += cost
    rows = [CostRow(k, int(v[0]), v[1], v[2], v[3]) for k, v in sums.items()]
    return sorted(rows, key=lambda r: (-r.cost_usd, -r.gpu_seconds, r.key))


def unpriced_models(items: Iterable[CostItem], prices: PriceBook) -> set[str]:
    """GPU names that no model of the price book matches (to warn about once)."""
    return {item.gpu_name for item in items if prices.model_of(item.gpu_name) is None}
