"""``PYTORCH_CUDA_ALLOC_CONF`` parsing (``AcceleratorAllocatorConfig::parseArgs`` and the CUDA hook
``CUDAAllocatorConfig::parseArgs``) and the power-of-two rounding (``round_size``,
``roundup_power2_next_division``, ``AcceleratorAllocatorConfig::roundup_power2_divisions``)."""

from __future__ import annotations

import pytest

from search.allocator import AllocatorConfig, CachingAllocator, allocation_size, parse_alloc_conf, round_size
from search.allocator.config import roundup_power2_next_division

MB = 1 << 20


def test_parses_the_usual_settings() -> None:
    """parseArgs: max_split_size_mb in MiB, expandable_segments True/False, the threshold, one division
    count for every interval (the backwards-compatible int form); whitespace is dropped (ConfigTokenizer)."""
    config = parse_alloc_conf(
        "max_split_size_mb:128, expandable_segments:True,garbage_collection_threshold:0.6,roundup_power2_divisions:4"
    )
    assert config.max_split_size == 128 * MB
    assert config.expandable_segments is True
    assert config.garbage_collection_threshold == 0.6
    assert config.roundup_power2_divisions == (4,) * 16
    assert parse_alloc_conf("") == AllocatorConfig()


def test_parses_the_per_interval_list() -> None:
    """parseRoundUpPower2Divisions: ``B:d`` sets the interval starting at B MiB, the first entry also every
    interval below it, ``>`` those after the last one (the values of torch's own allocator_config_test)."""
    config = parse_alloc_conf("roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]")
    expected = {32: 8, 64: 8, 128: 2, 256: 4, 512: 2, 1024: 4, 2048: 1, 64 * 1024: 1}
    assert {mb: config.divisions(mb * MB) for mb in expected} == expected
    assert config.divisions(100) == 8  # below 1 MiB: the first interval


def test_parses_the_2_13_keys_and_ignores_pinned_ones() -> None:
    """torch 2.13's AllocatorConfig.h: large_segment_size_mb (> 10) sets the 1-10 MiB segment and raises
    the floor of max_split_size_mb; max_non_split_rounding_mb; pinned and lock keys change no rule here."""
    config = parse_alloc_conf(
        "large_segment_size_mb:40,max_split_size_mb:40,max_non_split_rounding_mb:64,"
        "pinned_use_cuda_host_register:True,pinned_num_register_threads:8,release_lock_on_cudamalloc:False,"
        "backend:native,per_process_memory_fraction:0.5"
    )
    assert (config.large_segment_size, config.max_split_size) == (40 * MB, 40 * MB)
    assert config.max_non_split_rounding_size == 64 * MB
    assert config.per_process_memory_fraction == 0.5
    assert allocation_size(2 * MB, config) == 40 * MB
    with pytest.raises(ValueError, match="must be >= 40"):
        parse_alloc_conf("large_segment_size_mb:40,max_split_size_mb:30")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("max_split_size_mb:19", "must be >= 20"),
        ("max_split_size_mb", "expected ':'"),
        ("max_split_size_mb:", "a value for max_split_size_mb"),
        ("max_split_size_mb:abc", "non-negative integer"),
        ("max_split_size_mb:128 expandable_segments:True", "non-negative integer"),
        ("max_split_size_mb:128;expandable_segments:True", "non-negative integer"),
        ("expandable_segments:true", "True or False"),
        ("garbage_collection_threshold:0", "out of range"),
        ("garbage_collection_threshold:1.0", "out of range"),
        ("garbage_collection_threshold:high", "needs a number"),
        ("roundup_power2_divisions:3", "power of 2"),
        ("roundup_power2_divisions:[64:3]", "power of 2 or 0"),
        ("roundup_power2_divisions:[100:4]", "intervals must be powers of 2"),
        ("roundup_power2_divisions:[64:4", "expected ']'"),
        ("roundup_power2_divisions:[64:4;128:2]", "non-negative integer"),
        ("large_segment_size_mb:10", "must be >= 11"),
        ("per_process_memory_fraction:1.5", "out of range"),
        ("backend:cudaMallocAsync", "not the native caching allocator"),
        ("max_split_size_mb:128,foo:1", "unrecognized key 'foo'"),
    ],
)
def test_rejects_bad_settings_with_one_message(text: str, problem: str) -> None:
    """parseArgs / ConfigTokenizer: a bad key, value or separator is one ValueError naming the string."""
    with pytest.raises(ValueError, match="bad PYTORCH_CUDA_ALLOC_CONF") as raised:
        parse_alloc_conf(text)
    assert problem in str(raised.value)


def test_next_power_of_two_division() -> None:
    """roundup_power2_next_division: 1200 with 4 divisions of [1024, 2048) -> 1280; powers of two stay."""
    assert roundup_power2_next_division(1200, 4) == 1280
    assert roundup_power2_next_division(2048, 4) == 2048
    assert roundup_power2_next_division(10 * MB + 1, 4) == 12 * MB
    assert roundup_power2_next_division(10 * MB + 1, 8) == 11 * MB


def test_round_size_with_divisions() -> None:
    """round_size: power-of-two divisions apply only above 512 x divisions bytes; below, 512-byte rounding."""
    four = AllocatorConfig(roundup_power2_divisions=(4,) * 16)
    assert round_size(1200, four) == 1536  # 1200 <= 2048: plain rounding
    assert round_size(3000, four) == 3072
    assert round_size(MB + 1, four) == MB + MB // 4
    assert round_size(10 * MB + 1, four) == 12 * MB
    listed = parse_alloc_conf("roundup_power2_divisions:[64:8,>:1]")
    assert round_size(100 * MB + 1, listed) == 104 * MB  # [64, 128) MiB: 8 divisions of 8 MiB
    assert round_size(40 * MB + 1, listed) == 44 * MB  # below 64 MiB, filled by the first entry: 8 of 4 MiB
    assert round_size(200 * MB + 1, listed) == 200 * MB + 512  # 128 MiB and up (">"): 1 division, plain


def test_divisions_change_what_the_allocator_reserves() -> None:
    """malloc -> round_size: with 4 divisions a 10 MiB + 1 request becomes a 12 MiB block and segment."""
    a = CachingAllocator(AllocatorConfig(roundup_power2_divisions=(4,) * 16))
    a.malloc(10 * MB + 1)
    assert (a.stats.allocated_bytes.current, a.stats.reserved_bytes.current) == (12 * MB, 12 * MB)


def test_config_validates_its_fields() -> None:
    """AllocatorConfig: the table has the source's 16 intervals; an int fills it."""
    assert AllocatorConfig(roundup_power2_divisions=2).roundup_power2_divisions == (2,) * 16  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        AllocatorConfig(roundup_power2_divisions=(4, 4))
    with pytest.raises(ValueError):
        AllocatorConfig(garbage_collection_threshold=1.5)
