"""The images `make images` builds, built (or reused from the cache) once per test session. A
missing tool (buildah, debootstrap, runc: `make test` installs them) or a failed build fails the
tests of that image with the reason, and only those."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pytest

from embedfleet.testing.images import BuiltImage, ImagesError, ensure_images
from embedfleet.testing.imagespec import DEFAULT_IMAGES


class BuiltImages(Mapping[str, BuiltImage]):
    """name -> BuiltImage; looking up an image whose build failed raises that failure."""

    def __init__(self) -> None:
        self.images: dict[str, BuiltImage] = {}
        self.errors: dict[str, ImagesError] = {}
        for name in DEFAULT_IMAGES:
            try:
                (self.images[name],) = ensure_images([name])
            except ImagesError as error:
                self.errors[name] = error

    def __getitem__(self, name: str) -> BuiltImage:
        if name in self.errors:
            raise self.errors[name]
        return self.images[name]

    def __iter__(self) -> Iterator[str]:
        return iter(DEFAULT_IMAGES)

    def __len__(self) -> int:
        return len(DEFAULT_IMAGES)


@pytest.fixture(scope="session")
def built_images() -> BuiltImages:
    return BuiltImages()
