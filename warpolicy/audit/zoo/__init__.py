"""The zoo: the field's WAR bug shapes as runnable fixtures, each with a buggy and a fixed variant.

Each fixture reproduces the mechanism of a public report (cited in its model's docstring):

========================== ============================ =================================
fixture                    report                       what goes wrong
========================== ============================ =================================
req_pool_reuse             SGLang #18803                a request's pool row is reused
                                                        while the forward reads it
swa_mapping_recovery       SGLang #31687                a late layer recovers SWA slots
                                                        through the live mapping (-1 end)
live_mapping_reread        SGLang #32460                the SWA KV write after replay
                                                        translates through the live map
draft_extend_early_publish SGLang #37988                the draft extend publishes before
                                                        its replay
encoder_ring_no_wait       vLLM #53057                  an encoder-only step reuses a
                                                        host-visible ring without a wait
pinned_staging_reuse       TensorRT-LLM #15546          pinned staging rewritten while its
                                                        copy is pending
recurrent_state_replay     miles #1726, vLLM #51599     linear layers read recurrent state
                                                        during the replay
wrapper_one_child          REFERENCE 1f                 a wrapper declares one of the
                                                        children it runs
========================== ============================ =================================

* `warpolicy.audit.zoo.model`: `ZooModel`, the decode-like model every fixture varies;
* `warpolicy.audit.zoo.sglang`, `.peers`, `.hybrid`: the fixtures' models, by where they come from;
* `warpolicy.audit.zoo.fixture`: `ZooFixture`, ``FIXTURES``, `make_subject`;
* `warpolicy.audit.zoo.canary`: the WAR canary on a variant, overlapped;
* `warpolicy.audit.zoo.run`: `run_zoo`, `ZooReport`, `format_zoo` (``warpolicy audit --zoo``).
"""

from warpolicy.audit.zoo.canary import CanaryOutcome, canary_trial
from warpolicy.audit.zoo.fixture import (
    FIXTURES,
    VARIANTS,
    ZooFixture,
    fixture_names,
    make_subject,
    zoo_fixture,
    zoo_subjects,
)
from warpolicy.audit.zoo.run import (
    ZooReport,
    ZooRow,
    format_zoo,
    parse_fixtures,
    run_variant,
    run_zoo,
)

__all__ = [
    "FIXTURES",
    "VARIANTS",
    "CanaryOutcome",
    "ZooFixture",
    "ZooReport",
    "ZooRow",
    "canary_trial",
    "fixture_names",
    "format_zoo",
    "make_subject",
    "parse_fixtures",
    "run_variant",
    "run_zoo",
    "zoo_fixture",
    "zoo_subjects",
]
