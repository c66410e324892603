"""The corpus tool's states from the engine itself (patch P10, ``control.capture_states`` /
``write_states``) on a stand-in runner: each request's states land at their positions, a
record whose positions were not all computed with its own tokens is left out, and
capturing twice keeps one sink."""

from types import SimpleNamespace

import numpy as np
import torch

from vllm_selfspec import control

H = 4


class FakeRunner:
    """What the sink reads of vLLM's runner: the batch's rows and ``query_start_loc``."""

    def __init__(self) -> None:
        self.input_batch = SimpleNamespace(num_reqs=0, req_ids=[])
        self.query_start_loc = SimpleNamespace(np=np.zeros(8, dtype=np.int32))
        self.forwards = 0

    def _model_forward(self, input_ids=None, positions=None, intermediate_tensors=None,
                       inputs_embeds=None, **kwargs):
        self.forwards += 1
        # a state that tells its token and position apart: [token, position, 0, 0]
        return torch.stack([input_ids.float(), positions.float(),
                            torch.zeros_like(positions, dtype=torch.float32),
                            torch.zeros_like(positions, dtype=torch.float32)], dim=1)

    def step(self, rows: list[tuple[str, list[int], int]]) -> None:
        """One forward: per row (request id, tokens, position of the first)."""
        self.input_batch.num_reqs = len(rows)
        self.input_batch.req_ids = [r[0] for r in rows]
        lens = [len(r[1]) for r in rows]
        self.query_start_loc.np[: len(rows) + 1] = np.cumsum([0, *lens])
        ids = torch.tensor([t for r in rows for t in r[1]] + [0, 0])  # padded, as vLLM pads
        pos = torch.tensor([r[2] + i for r in rows for i in range(len(r[1]))] + [0, 0])
        self._model_forward(input_ids=ids, positions=pos)


def test_states_land_at_their_positions_and_bad_records_are_left_out(tmp_path):
    runner = FakeRunner()
    worker = SimpleNamespace(model_runner=runner)
    control.capture_states(worker)
    control.capture_states(worker)  # idempotent: one sink
    prompt_a, resp_a = [5, 6, 7], [8, 9, 10]
    prompt_b, resp_b = [1, 2], [3, 4]
    # vLLM's engine ids carry a suffix; b's prompt comes in two chunks
    runner.step([("0-abcdefgh", prompt_a, 0), ("1-ijklmnop", prompt_b[:1], 0)])
    runner.step([("0-abcdefgh", [8], 3), ("1-ijklmnop", prompt_b[1:], 1)])
    runner.step([("0-abcdefgh", [9], 4), ("1-ijklmnop", [3], 2)])
    # a's last token (10) is never fed; request 4 is not asked for below
    runner.step([("2-qrstuvwx", [1, 2], 0), ("4-yzabcdef", [9], 0)])
    assert runner.forwards == 4
    shard = control.write_states(worker, str(tmp_path / "s.npz"), [
        ("0", "a", prompt_a, resp_a),
        ("1", "b", prompt_b, resp_b),   # position 3 (its token 3's successor) never computed
        ("2", "c", [1, 2], [7, 7]),     # computed, but c's answer is not what was fed
        ("3", "d", [1], [2])])          # never seen
    assert shard["ids"] == ["a", "b"] and shard["missing"] == ["c", "d"]
    z = np.load(tmp_path / shard["file"])
    n = len(prompt_a) + len(resp_a)
    assert list(z["offsets"]) == [0, n, n + 4] and shard["tokens"] == n + 4
    a = slice(0, n)
    assert list(z["tokens"][a]) == prompt_a + resp_a
    # the state at position p is the one computed for (token p, position p); the last is 0
    assert list(z["hidden"][a, 0]) == [5, 6, 7, 8, 9, 0]
    assert list(z["hidden"][a, 1]) == [0, 1, 2, 3, 4, 0]
    assert list(z["labels"][a]) == [-1, -1, 8, 9, 10, -1]
    assert list(z["loss_mask"][a]) == [False, False, True, True, True, False]
    assert list(z["labels"][n:]) == [-1, 3, 4, -1]
    # the states of every record asked for are forgotten, written or not
    assert set(runner._selfspec_states) == {"4-yzabcdef"}


def test_forget_states_drops_only_the_requests_named():
    runner = FakeRunner()
    worker = SimpleNamespace(model_runner=runner)
    control.capture_states(worker)
    runner.step([("0-abcdefgh", [5, 6], 0), ("1-ijklmnop", [1], 0), ("2-qrstuvwx", [3], 0)])
    # a caller's id and an engine id; "9" was never captured
    assert control.forget_states(worker, ["0", "2-qrstuvwx", "9"]) == 2
    assert set(runner._selfspec_states) == {"1-ijklmnop"}


def test_a_record_already_in_a_shard_is_forgotten_not_written_again(tmp_path):
    from vllm_selfspec.offline import chimera_data as cd

    runner = FakeRunner()
    worker = SimpleNamespace(model_runner=runner)
    llm = SimpleNamespace(collective_rpc=lambda f, args=(): [f(worker, *args)])
    control.capture_states(worker)
    runner.step([("0-abcdefgh", [5, 6, 7], 0), ("1-ijklmnop", [1, 2], 0)])
    first = cd.write_engine_states(llm, tmp_path, [{"id": "a", "prompt": [5, 6], "response": [7, 8]}],
                                   ["0"])
    assert first["ids"] == ["a"]
    # a resumed run answers "a" again beside "b": only "b" is written, and nothing is kept
    runner.step([("2-qrstuvwx", [5, 6, 7], 0)])
    second = cd.write_engine_states(llm, tmp_path, [
        {"id": "a", "prompt": [5, 6], "response": [7, 8]},
        {"id": "b", "prompt": [1], "response": [2, 3]}], ["2", "1"])
    assert second["ids"] == ["b"]
    assert [s["ids"] for s in cd.read_index(tmp_path)["shards"]] == [["a"], ["b"]]
    assert runner._selfspec_states == {}
