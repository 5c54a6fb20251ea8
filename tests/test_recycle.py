"""The recycle drafter: prompt lookup first, else a chain from the table of the target's own past choices; each source
sized by its own acceptance."""
import numpy as np
import torch

from specdec.costs import CostModel
from specdec.drafters.base import Budget, DraftRequest
from specdec.drafters.lookup.ngram import ngram_lookup
from specdec.drafters.lookup.recycle import RecycleDrafter, SuccessorTable
from specdec.verify import Draft

FLAT = CostModel({1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0, 16: 1.0})  # drafting costs nothing: any acceptance pays


def started(prompt, drafter=None, adaptive=True, costs=FLAT):
    drafter = drafter or RecycleDrafter()
    drafter.begin(DraftRequest(prompt_ids=list(prompt), costs=costs, adaptive=adaptive))
    return drafter


def test_the_table_prefers_the_pair_and_falls_back_to_the_token():
    table = SuccessorTable()
    table.record(4, 5, 7)
    table.record(None, 5, 6)  # the latest choice after a token replaces the one before
    assert table.next_after(4, 5) == 7 and table.next_after(3, 5) == 6 and table.next_after(None, 5) == 6
    assert table.next_after(4, 9) is None
    table.record(1, 5, 8)
    assert table.next_after(3, 5) == 8 and table.next_after(4, 5) == 7 and table.next_after(1, 5) == 8


def test_a_chain_walks_the_table_from_the_last_two_tokens():
    table = SuccessorTable()
    for previous, token, choice in [(1, 2, 3), (2, 3, 4), (3, 4, 2), (4, 2, 9)]:
        table.record(previous, token, choice)
    assert table.chain(1, 2, 10) == [3, 4, 2, 9]  # (4, 2) -> 9 wins over (1, 2) -> 3
    assert table.chain(1, 2, 2) == [3, 4]
    assert table.chain(7, 8, 3) == []


def test_a_full_table_forgets_its_pairs_not_its_tokens():
    table = SuccessorTable(max_pairs=2)
    for token in range(3):
        table.record(100, token, token + 10)
    assert len(table.after_pair) == 1 and len(table.after_token) == 3


def test_where_the_context_repeats_itself_it_drafts_what_prompt_lookup_drafts():
    prompt = [1, 2, 3, 4, 1, 2]
    drafter = started(prompt, adaptive=False)
    expected = ngram_lookup(np.array(prompt), 3, 2, 4).tolist()
    assert drafter.propose(prompt, Budget(3, tree=True)).tokens.tolist() == expected == [3, 4, 1]


def test_it_learns_the_targets_choices_not_the_prompt():
    drafter = started([1, 2, 3], adaptive=False)
    assert len(drafter.propose([1, 2, 3], Budget(4, tree=True))) == 0  # the prompt's own pairs are not choices
    context = [1, 2, 3, 7, 8]  # the target wrote 7, then 8
    drafter.propose(context, Budget(4, tree=True))
    assert drafter.table.next_after(3, 7) == 8 and drafter.table.next_after(2, 3) == 7
    assert drafter.table.next_after(1, 2) is None


def test_every_scored_row_feeds_the_table_rejected_ones_included():
    drafter = started([1, 2, 3], adaptive=False)
    drafter.table.record(2, 3, 40)
    drafter.table.record(3, 40, 41)
    draft = drafter.propose([1, 2, 3], Budget(2, tree=True))
    assert draft.tokens.tolist() == [40, 41]
    # the target chose 50 after 3 (so 40 was rejected), 60 after 40 and 70 after 41
    drafter.scored(draft, torch.tensor([50, 60, 70]), [])
    assert drafter.table.next_after(3, 40) == 60 and drafter.table.next_after(40, 41) == 70


def test_tokens_it_did_not_draft_teach_nothing():
    drafter = started([1, 2, 3], adaptive=False)
    drafter.table.record(2, 3, 40)
    drafter.propose([1, 2, 3], Budget(1, tree=True))
    drafter.scored(Draft(tokens=torch.tensor([99])), torch.tensor([5, 6]), [])  # a constraint's forced token
    assert drafter.table.next_after(3, 99) is None


def test_forks_share_one_table():
    first = RecycleDrafter()
    second = first.fork()
    first.table.record(1, 2, 3)
    assert second.table.next_after(1, 2) == 3 and second.table is first.table


def test_a_source_whose_chains_are_never_accepted_stops_drafting_and_the_other_goes_on():
    drafter = started([], costs=CostModel({1: 1.0, 2: 1.3, 4: 1.6, 8: 2.2, 16: 3.4}))
    context, wrong_table_drafts = [0], 0
    for step in range(1, 60):
        drafter.table.record(context[-2] if len(context) > 1 else None, context[-1], 99_999)  # always wrong
        draft = drafter.propose(context, Budget(4, tree=True))
        wrong_table_drafts += bool(len(draft))
        context.append(step)  # the target writes a token the table never has, and the context never repeats
    assert wrong_table_drafts < 15
    copied = context + context[:4]  # now the context repeats: lookup still drafts
    assert len(drafter.propose(copied, Budget(4, tree=True))) > 0


def test_in_a_batch_the_engine_gives_the_length():
    drafter = started([5, 6, 7, 5, 6, 7, 5, 6])
    assert len(drafter.propose([5, 6, 7, 5, 6, 7, 5, 6], Budget(2, tree=False))) == 2
