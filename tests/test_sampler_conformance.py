"""Every sampler against the sampler conformance suite (``expstore.testing.sampler``), on a
local store and on a ``memory://`` store: sampler x storage, as TorchRL parametrizes its
replay-buffer tests."""

from __future__ import annotations

import pytest

from expstore.testing.sampler import SAMPLER_CASES, SamplerTests, store_url


class TestSamplers(SamplerTests):
    @pytest.fixture(params=SAMPLER_CASES, ids=str)
    def case(self, request):
        return request.param

    @pytest.fixture(params=["local", "memory"])
    def url(self, request, tmp_path):
        return store_url(request.param, tmp_path)
