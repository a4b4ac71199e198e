"""warpolicy.registry.facts: a batch's facts as the evaluation reads them, and fact classes."""

from __future__ import annotations

import pytest

from warpolicy.errors import InputError, UnknownNameError
from warpolicy.registry.facts import (
    ABSENT,
    BatchFacts,
    check_facts,
    fact_classes,
    parse_fact_value,
    passes,
    simplify,
)
from warpolicy.registry.model import Fact, FactTest
from warpolicy.registry.vocabulary import FactType

N = Fact("n", FactType.INT)
A = Fact("a", FactType.ACTION)
B = Fact("b", FactType.BOOL)
R = Fact("r", FactType.NAME, values=frozenset({"text", "image"}))
ANY = Fact("any", FactType.NAME)
DECLARED = {f.name: f for f in (N, A, B, R, ANY)}


class TestBatchFacts:
    def test_valid_values_are_known_anything_else_is_unknown(self):
        facts = BatchFacts(DECLARED, {"n": 5, "b": False, "r": "image"})
        assert facts.value("n") == (True, 5)
        assert facts.value("b") == (True, False)
        assert facts.value("r") == (True, "image")
        assert facts.value("any") == (False, None)  # not reported
        for wrong in ({"n": True}, {"n": "5"}, {"b": 1}, {"r": "video"}, {"r": 3}):
            name = next(iter(wrong))
            assert BatchFacts(DECLARED, wrong).value(name) == (False, None), wrong
        assert facts.read == {"n", "b", "r", "any"}

    @pytest.mark.parametrize(
        "value,done", [(True, True), (False, False), (1, False), ("yes", False), (None, False)]
    )
    def test_an_action_succeeded_only_when_it_reported_true(self, value, done):
        assert BatchFacts(DECLARED, {"a": value}).succeeded("a") is done
        assert BatchFacts(DECLARED, {}).succeeded("a") is False

    @pytest.mark.parametrize(
        "given,test,holds",
        [
            ({}, FactTest(compare=(("gt", 10),)), True),  # unknown: fail closed
            ({"n": 11}, FactTest(compare=(("gt", 10),)), True),
            ({"n": 10}, FactTest(compare=(("gt", 10),)), False),
            ({"n": 10}, FactTest(compare=(("ge", 10), ("le", 10))), True),
            ({"n": "11"}, FactTest(compare=(("gt", 10),)), True),  # invalid = unknown
            ({}, FactTest(equals=False), True),
        ],
    )
    def test_int_tests(self, given, test, holds):
        name = "a" if test.equals is not None else "n"
        assert passes(BatchFacts(DECLARED, given), name, test)[0] is holds

    @pytest.mark.parametrize(
        "given,holds", [({}, True), ({"a": False}, True), ({"a": 0}, True), ({"a": True}, False)]
    )
    def test_an_action_tested_for_false_holds_unless_it_succeeded(self, given, holds):
        assert passes(BatchFacts(DECLARED, given), "a", FactTest(equals=False))[0] is holds

    def test_name_and_bool_tests(self):
        image = FactTest(names=frozenset({"image"}))
        assert passes(BatchFacts(DECLARED, {"r": "image"}), "r", image)[0]
        assert not passes(BatchFacts(DECLARED, {"r": "text"}), "r", image)[0]
        assert passes(BatchFacts(DECLARED, {}), "r", image)[0]
        assert not passes(BatchFacts(DECLARED, {"b": False}), "b", FactTest(equals=True))[0]

    def test_describe(self):
        facts = BatchFacts(DECLARED, {"n": 3, "a": True, "r": "video"})
        assert facts.describe("n") == "n is 3"
        assert facts.describe("a") == "a succeeded"
        assert facts.describe("b") == "b is not reported"
        assert "not a value of the fact" in facts.describe("r")


class TestCheckFacts:
    def test_unknown_names_have_close_matches(self):
        with pytest.raises(UnknownNameError, match="did you mean 'any'"):
            check_facts(DECLARED, {"anx": "x"})

    @pytest.mark.parametrize(
        "given,message",
        [
            ({"n": True}, "expected an integer"),
            ({"b": "yes"}, "expected true or false"),
            ({"r": "video"}, "expected a name among image, text"),
            ({"a": 1}, "an action reports true or false"),
        ],
    )
    def test_wrong_types_are_input_errors(self, given, message):
        with pytest.raises(InputError, match=message):
            check_facts(DECLARED, given)

    def test_valid_facts_pass(self):
        check_facts(DECLARED, {"n": 0, "a": False, "b": True, "r": "text", "any": "x"})

    @pytest.mark.parametrize(
        "fact,text,value",
        [(N, " 12 ", 12), (A, "1", True), (B, "off", False), (R, "image", "image")],
    )
    def test_parse_fact_value(self, fact, text, value):
        assert parse_fact_value(fact, text) == value

    def test_parse_fact_value_refuses_junk(self):
        with pytest.raises(InputError, match="expected an integer"):
            parse_fact_value(N, "many")
        with pytest.raises(InputError, match="not a boolean"):
            parse_fact_value(A, "maybe")


class TestClasses:
    def test_int_classes_split_at_every_threshold(self):
        tests = [FactTest(compare=(("gt", 11673),)), FactTest(compare=(("le", 100), ("eq", 50)))]
        classes = fact_classes(N, tests)
        assert classes.cuts == (50, 51, 101, 11674)
        assert classes.labels == (
            "n <= 49",
            "n = 50",
            "51 <= n <= 100",
            "101 <= n <= 11673",
            "n >= 11674",
            "n unknown",
        )
        for value, index in [(0, 0), (50, 1), (100, 2), (11673, 3), (11674, 4), (10**9, 4)]:
            assert classes.classify(value) == index
            assert classes.classify(classes.probes[index]) == index
        for junk in (None, ABSENT, True, "5", 5.0):
            assert classes.classify(junk) == classes.unknown == 5

    def test_an_int_without_tests_has_one_class_and_unknown(self):
        classes = fact_classes(N, [])
        assert classes.labels == ("n is any integer", "n unknown")
        assert classes.classify(7) == 0

    def test_action_classes(self):
        classes = fact_classes(A, [FactTest(equals=False)])
        assert classes.labels == ("a succeeded", "a did not succeed")
        assert [classes.classify(v) for v in (True, False, None, 1, ABSENT)] == [0, 1, 1, 1, 1]
        assert classes.unknown == 1

    def test_bool_classes(self):
        classes = fact_classes(B, [])
        assert [classes.classify(v) for v in (True, False, None, 0)] == [0, 1, 2, 2]

    def test_name_classes_cover_tested_names_others_and_unknown(self):
        classes = fact_classes(ANY, [FactTest(names=frozenset({"x", "y"}))], labels=["z"])
        assert classes.labels == (
            "any is x",
            "any is y",
            "any is z",
            "any is another name",
            "any unknown",
        )
        assert [classes.classify(v) for v in ("x", "y", "z", "w", 3, ABSENT)] == [0, 1, 2, 3, 4, 4]
        assert classes.classify(classes.probes[3]) == 3

    def test_a_name_fact_with_every_value_tested_has_no_other_class(self):
        classes = fact_classes(R, [FactTest(names=frozenset({"image"}))], labels=["text"])
        assert classes.labels == ("r is image", "r is text", "r unknown")
        assert classes.classify("video") == classes.unknown


def covers(merged, rows) -> bool:
    """Every assignment of ``rows`` falls in exactly one merged row, with its outcome."""
    for key, out in rows:
        hits = {o for k, o in merged if all(m is None or m == c for m, c in zip(k, key))}
        if hits != {out}:
            return False
    return True


class TestSimplify:
    def test_a_fact_that_does_not_matter_is_dropped(self):
        rows = [((0, 0), 0), ((0, 1), 0), ((1, 0), 0), ((1, 1), 3)]
        merged = simplify(rows, [2, 2])
        assert merged == [((None, 0), 0), ((0, None), 0), ((1, 1), 3)]
        assert covers(merged, rows)

    def test_nothing_merges_when_every_class_matters(self):
        rows = [((0,), 2), ((1,), 0), ((2,), 1)]
        assert simplify(rows, [3]) == [((1,), 0), ((2,), 1), ((0,), 2)]

    def test_everything_merges_to_any(self):
        rows = [((i, j), 1) for i in range(3) for j in range(2)]
        assert simplify(rows, [3, 2]) == [((None, None), 1)]

    def test_the_sparse_prefill_shape(self):
        # tokens: <=100, >=101, unknown; snapshot: succeeded, not
        rows = [((t, s), 0 if t == 0 or s == 0 else 3) for t in range(3) for s in range(2)]
        merged = simplify(rows, [3, 2])
        assert merged == [((None, 0), 0), ((0, None), 0), ((1, 1), 3), ((2, 1), 3)]
        assert covers(merged, rows)
