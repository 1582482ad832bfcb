"""The lab's figure functions on a hand-made result: text is escaped, bars merge runs of
steps, a request that sat out steps gets a waiting bar (no engine needed)."""
import json

from visualizers.lab import bars, gantt, occupancy, segments


def setting():
    steps = [{"step": n, "start_s": n * 0.1, "seconds": 0.1, "waiting": w, "running": 1, "free_blocks": 3,
              "batch": b, "prefill_tokens": 0, "decode_tokens": 1}
             for n, w, b in [(1, 0, [{"request_id": "a", "kind": "prefill", "num_tokens": 5}]),
                             (2, 1, [{"request_id": "a", "kind": "decode", "num_tokens": 1}]),
                             (3, 1, [{"request_id": "b", "kind": "prefill", "num_tokens": 3}]),
                             (4, 0, [{"request_id": "a", "kind": "decode", "num_tokens": 1}]),
                             (5, 0, [{"request_id": "a", "kind": "decode", "num_tokens": 1}])]]
    reqs = [{"request_id": "a", "role": "<script>x</script>", "arrival_s": 0.1, "steps": [1, 2, 4, 5]},
            {"request_id": "b", "role": "b", "arrival_s": 0.0, "steps": [3]}]
    return {"setting": {"name": "s", "label": "A & B", "options": {}}, "steps": steps, "per_request": reqs,
            "metrics": {"x": 1.5}}


def test_segments_merge_runs_and_show_the_steps_sat_out():
    s = setting()
    by = {st["step"]: st for st in s["steps"]}
    segs = segments(s["per_request"][0], by)
    assert [(g["kind"], g["first"], g["last"], g["tokens"]) for g in segs] == [
        ("prefill", 1, 1, 5), ("decode", 2, 2, 1), ("waiting", 3, 3, 0), ("decode", 4, 5, 2)]
    assert [g["kind"] for g in segments(s["per_request"][1], by)] == ["waiting", "prefill"]


def test_text_in_figures_is_escaped_and_the_figures_are_json():
    s = setting()
    figs = [gantt(s), occupancy([s], 2), bars([s], [("x", "x <b>", "u")], "t")]
    text = json.dumps(figs)
    assert "<script>" not in text and "&lt;script&gt;" in text
    assert "A &amp; B" in text and "x &lt;b&gt;" in text
    occ, waste = occupancy([s], 2)["data"]
    assert occ["y"] == [1, 1, 1, 1, 1] and waste["customdata"] == [0, 1, 1, 0, 0]
