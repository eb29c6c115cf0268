"""The speculative-decoding contract: --spec's text, a decode's drafts through Step and pack(), the verified tokens."""
from __future__ import annotations

import pytest

from prefillbench.sequence import Sequence
from prefillbench.speculation import SpecConfig, parse_spec, spec_label
from prefillbench.step import DecodeToken, PrefillChunk, Step, pack
from strategies.base import cut_drafts, decode_tokens


def test_parse_spec_forms_and_labels():
    assert parse_spec("off") is None and parse_spec("none") is None and spec_label(None) == "off"
    ngram = parse_spec("ngram:3")
    assert ngram == SpecConfig("ngram", 3, None, 2, 4, ())
    assert ngram.label == "ngram:3"
    wide = parse_spec("ngram:5:min=1:max=6")
    assert (wide.k, wide.lookup_min, wide.lookup_max) == (5, 1, 6) and wide.label == "ngram:5:min=1:max=6"
    eagle = parse_spec("eagle:3:accept=0.7")
    assert (eagle.method, eagle.k, eagle.accept) == ("eagle", 3, 0.7) and eagle.label == "eagle:3:accept=0.7"
    dyn = parse_spec("mtp:2:accept=0.8:batch=1-8/3+9-64/1")
    assert dyn.k_by_batch == ((1, 8, 3), (9, 64, 1))
    assert [dyn.k_for_batch(n) for n in (1, 8, 9, 64, 65)] == [3, 3, 1, 1, 2]
    assert parse_spec(dyn.label) == dyn and parse_spec(wide.label) == wide


@pytest.mark.parametrize("text", [
    "ngram", "ngram:0", "ngram:x", "foo:3", "eagle:3", "ngram:3:accept=0.5", "eagle:3:accept=1.5",
    "ngram:3:min=4:max=2", "ngram:3:bogus=1", "eagle:3:accept=0.7:min=1", "mtp:2:accept=0.8:batch=8-1/2",
])
def test_parse_spec_refuses_bad_text_in_one_line(text):
    with pytest.raises(ValueError) as e:
        parse_spec(text)
    assert "\n" not in str(e.value) and text in str(e.value)


def test_decode_with_drafts_packs_k_plus_one_positions_with_a_logit_row_each():
    step = Step(prefills=(PrefillChunk(1, (5, 6, 7), 0, True),),
                decodes=(DecodeToken(2, 40, 9, (41, 42)), DecodeToken(3, 50, 4)))
    assert step.n_decode_tokens == 4 and step.n_tokens == 7 and step.n_draft_tokens == 2
    p = pack(step)
    assert p.tokens.tolist() == [5, 6, 7, 40, 41, 42, 50]
    assert p.positions.tolist() == [0, 1, 2, 9, 10, 11, 4]
    assert p.seq_ids.tolist() == [1, 1, 1, 2, 2, 2, 3]
    assert p.logit_rows.tolist() == [2, 3, 4, 5, 6] and p.emitting == (1, 2, 3) and p.row_counts == (1, 3, 1)
    result = p.greedy_result([8, 41, 99, 7, 51])
    assert result.next_tokens == {1: 8, 2: 41, 3: 51}
    assert result.verified == {2: (41, 99, 7)}


def test_a_step_without_drafts_packs_as_before():
    p = pack(Step(decodes=(DecodeToken(2, 40, 9), DecodeToken(3, 50, 4))))
    assert p.row_counts == () and p.logit_rows.tolist() == [0, 1]
    result = p.greedy_result([1, 2])
    assert result.next_tokens == {2: 1, 3: 2} and result.verified == {}


def test_decode_tokens_carries_each_sequences_drafts_and_cut_drafts_trims_them():
    seq = Sequence(7, (1, 2, 3), 10, 0.0, n_prefilled=3, generated=[4])
    seq.drafts = [5, 6, 7]
    (d,) = decode_tokens([seq])
    assert d == DecodeToken(7, 4, 3, (5, 6, 7))
    assert cut_drafts(d, 1).drafts == (5,) and cut_drafts(d, 0).drafts == () and cut_drafts(d, 5) is d
    seq.drafts = []
    assert decode_tokens([seq])[0].drafts == ()
