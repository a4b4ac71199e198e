"""Model adapters built on model adapters: the batch measure and `ModelView`."""

from __future__ import annotations

import inspect

from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.runners.adapters import ModelView, batch_measure
from warpolicy.runtime.runners.protocols import ClassedModel, SizedModelAdapter, class_buffers
from warpolicy.testing import RecModel

DECODE = ForwardMode.DECODE


class Sized(RecModel):
    def batch_size(self, batch):
        return 2 * len(batch)


def test_the_measure_is_the_model_s_batch_size_else_len():
    assert batch_measure(Sized())([1, 2, 3]) == 6
    assert batch_measure(RecModel()) is len


def test_a_view_hands_every_member_to_its_model():
    model = Sized()
    view = ModelView(model)
    assert view.shared_buffers is model.shared_buffers
    assert view.bucket_sizes(DECODE) == model.bucket_sizes(DECODE)
    assert view.batch_size([1]) == 2
    view.prepare_bucket(2)
    view.host_prep([1.0, 3.0], 2)
    view.graph_prep(2)
    out = view.forward(2)
    assert model.prepared == [2]
    assert model.events[-3:] == [("host_prep", 2, 2), ("graph_prep", 2), ("forward", 2)]
    assert out is model.out[2] and out.tolist() == [2.0, 6.0]


def test_a_view_is_a_sized_adapter_statically_and_keeps_overrides():
    class NoForward(ModelView):
        def forward(self, bucket):
            return None

    view = NoForward(RecModel())
    assert isinstance(view, SizedModelAdapter)
    for member in ("batch_size", "graph_prep", "forward", "shared_buffers"):
        assert inspect.getattr_static(view, member) is not None  # Python 3.12's isinstance
    assert view.forward(2) is None


def test_views_of_views_keep_the_buffer_classes_statically():
    class Classed(RecModel):
        buffer_classes = {"table": "recurrent_state"}

    inner = Classed()
    views = [ModelView(ModelView(inner)), ModelView(RecModel())]
    # Python 3.12's isinstance reads attributes statically: the class self-check must still
    # walk only a class's own buffers through every view (found on an H100: the audit's
    # launch-site view hid them, and the metadata class was checked against every buffer)
    assert inspect.getattr_static(views[0], "buffer_classes") == {"table": "recurrent_state"}
    assert isinstance(views[0], ClassedModel) and not isinstance(views[1], ClassedModel)
    assert set(class_buffers(views[0], "recurrent_state")) == {"table"}
    assert set(class_buffers(views[0], "metadata")) == set()
    assert set(class_buffers(views[1], "metadata")) == {"table"}  # not said: every buffer
