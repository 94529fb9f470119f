"""Hardware profiles measured several times: a shared machine drifts, so figures are medians."""

from __future__ import annotations

import statistics


def median_profile(profiles: list) -> object:
    """Field-wise median of profiles of the same machine (numbers); other values from the first.

    Lists of equal length are merged element by element, so tables (storage rates, core classes)
    keep their rows; an int field stays an int."""
    first = profiles[0]
    if isinstance(first, dict):
        return {k: median_profile([p[k] for p in profiles]) for k in first}
    if isinstance(first, list) and all(isinstance(p, list) and len(p) == len(first) for p in profiles):
        return [median_profile([p[i] for p in profiles]) for i in range(len(first))]
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        value = statistics.median(profiles)
        return int(value) if isinstance(first, int) else value
    return first
