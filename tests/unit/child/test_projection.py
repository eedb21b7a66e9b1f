"""Reading the engine's projection (``--fit`` at ``-lv 4``) out of its log."""

from __future__ import annotations

import trio
import trio.testing

from troupe.actors.measure import fit_disabled, read_projection

MIB = 1 << 20
ONE_BLOCK = """\
0.00.003.701 I common_params_fit_impl: getting device memory data for initial parameters:
0.00.296.163 I common_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |
0.00.296.171 I common_memory_breakdown_print: |   - Host               |                  296 =   222 +      49 +      24                |
0.00.296.171 I common_memory_breakdown_print: |   - CPU_REPACK         |                   12 =    12 +       0 +       0                |
0.00.324.814 I common_params_fit_impl: projected to use 296 MiB of host memory vs. 24105 MiB
0.00.409.481 I load_tensors: loading model tensors, this can take a while...
"""  # noqa: E501
TWO_BLOCKS = """\
I common_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |
I common_memory_breakdown_print: |   - CUDA0 (NVIDIA H200) | 143000 = 1000 + (9000 =  4000 +  4500 +  500) +  133000 |
I common_memory_breakdown_print: |   - Host               |                  300 =   200 +      50 +      50                |
I common_params_fit_impl: context size reduced from 131072 to 32768
I common_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |
I common_memory_breakdown_print: |   - CUDA0 (NVIDIA H200) | 143000 = 1000 + (5400 =  4000 +  1100 +  300) +  136600 |
I common_memory_breakdown_print: |   - Host               |                  280 =   200 +      40 +      40                |
I common_fit_params: successfully fit params to free device memory
"""  # noqa: E501


async def projection_of(text: str) -> object:
    send, recv = trio.testing.memory_stream_one_way_pair()
    await send.send_all(text.encode())
    await send.aclose()
    return await read_projection(recv)


async def test_host_rows_add_up_and_the_projection_ends_at_the_fit_line() -> None:
    got = await projection_of(ONE_BLOCK)
    assert got is not None
    assert got.min == {"host": (222 + 49 + 24 + 12) * MIB}  # type: ignore[attr-defined]
    assert got.max is None  # type: ignore[attr-defined]


async def test_a_context_fit_shrank_gives_min_and_max_per_device() -> None:
    got = await projection_of(TWO_BLOCKS)
    assert got.min == {"cuda:0": 5400 * MIB, "host": 280 * MIB}  # type: ignore[attr-defined]
    assert got.max == {"cuda:0": 9000 * MIB, "host": 300 * MIB}  # type: ignore[attr-defined]


async def test_a_log_without_a_projection_is_none() -> None:
    assert await projection_of("I load_tensors: loading model tensors\n") is None
    assert await projection_of("") is None


def test_fit_off_on_the_command_line_means_no_projection() -> None:
    assert fit_disabled(["llama-server", "-m", "x", "--fit", "off"])
    assert fit_disabled(["llama-server", "-fit", "0"])
    assert not fit_disabled(["llama-server", "--fit", "on"])
