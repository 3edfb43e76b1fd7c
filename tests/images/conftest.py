"""The images `make images` builds, built (or reused from the cache) once per test session. With
buildah, debootstrap or runc missing this fails with the reason: `make test` installs them."""

from __future__ import annotations

import pytest

from embedfleet.testing.images import BuiltImage, ensure_images


@pytest.fixture(scope="session")
def built_images() -> dict[str, BuiltImage]:
    return {image.name: image for image in ensure_images()}
