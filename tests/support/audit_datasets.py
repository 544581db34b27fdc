"""Factories for ``trainer-resume audit-loader`` tests (imported by the real command)."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler, get_worker_info

SIZE = 24
BAD_ID = 17


class ImageDataset(Dataset):
    """``{"id", "image", "label"}`` samples whose contents depend only on the index."""

    def __init__(self, size: int = SIZE, *, bad_id: int | None = None) -> None:
        self.size = size
        self.bad_id = bad_id

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict:
        channels = 1 if index == self.bad_id else 3
        image = (
            torch.arange(channels * 16 * 16, dtype=torch.float32).reshape(channels, 16, 16) + index
        )
        return {"id": index, "image": image, "label": index % 4}


class NoisyDataset(ImageDataset):
    """Draws its noise from the process's torch RNG: workers see different RNG streams."""

    def __getitem__(self, index: int) -> dict:
        sample = super().__getitem__(index)
        sample["image"] = sample["image"] + torch.rand(())
        return sample


class RepeatingSampler(Sampler[int]):
    """Delivers index 3 twice and never index 5."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __iter__(self):
        return iter([3 if index == 5 else index for index in range(self.size)])


def good_dataset() -> ImageDataset:
    return ImageDataset()


def empty_dataset() -> ImageDataset:
    return ImageDataset(0)


def bad_shape_dataset() -> ImageDataset:
    return ImageDataset(bad_id=BAD_ID)


def noisy_dataset() -> NoisyDataset:
    return NoisyDataset()


def repeating_loader(num_workers: int) -> DataLoader:
    return DataLoader(
        ImageDataset(), batch_size=4, sampler=RepeatingSampler(SIZE), num_workers=num_workers
    )


def loader_without_workers_argument() -> DataLoader:
    return DataLoader(ImageDataset(), batch_size=4)


class TupleDataset(Dataset):
    """``(image, label)`` samples, the usual shape of a vision dataset; optionally augmented
    with noise drawn from torch's global generator."""

    def __init__(self, *, noisy: bool = False) -> None:
        self.noisy = noisy

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> tuple:
        image = torch.arange(3 * 4 * 4, dtype=torch.float32).reshape(3, 4, 4) + index
        if self.noisy:
            image = image + torch.rand(())
        return image, index % 4


def tuple_dataset() -> TupleDataset:
    return TupleDataset()


def noisy_tuple_dataset() -> TupleDataset:
    return TupleDataset(noisy=True)


def shuffled_noisy_tuple_loader(num_workers: int) -> DataLoader:
    """A plain shuffled DataLoader whose samples draw from the generator that also shuffles."""
    return DataLoader(TupleDataset(noisy=True), batch_size=4, shuffle=True, num_workers=num_workers)


def resumable_noisy_loader(num_workers: int):
    """Endless resumable stream; batches of 5 do not divide the 24 samples of a cycle."""
    from trainer_resume.loaders import InfiniteRandomSampler, ResumableDataLoader

    dataset = NoisyDataset()
    return ResumableDataLoader(
        dataset,
        batch_size=5,
        sampler=InfiniteRandomSampler(dataset, resumable=True),
        num_workers=num_workers,
        resumable=True,
    )


class ItemStream(IterableDataset):
    """30 ``{"id", "image"}`` items, its own iterator with a position as its state; split by
    worker (torch's recipe) when ``sharded``; augmented from torch's generator if ``noisy``."""

    ITEMS = 30

    def __init__(self, *, sharded: bool = True, noisy: bool = False) -> None:
        self.sharded = sharded
        self.noisy = noisy
        self.position = 0
        self.numbers: list[int] = []

    def _numbers(self) -> list[int]:
        info = get_worker_info()
        if info is None or not self.sharded:
            return list(range(self.ITEMS))
        return list(range(info.id, self.ITEMS, info.num_workers))

    def __iter__(self) -> ItemStream:
        self.numbers, self.position = self._numbers(), 0
        return self

    def __next__(self) -> dict:
        if self.position >= len(self.numbers):
            raise StopIteration
        number = self.numbers[self.position]
        self.position += 1
        image = torch.full((3, 4, 4), float(number))
        if self.noisy:
            image = image + torch.rand(())
        return {"id": number, "image": image}

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


class PlainItems(IterableDataset):
    """Items without any state: a generator."""

    def __iter__(self):
        yield from ({"id": number} for number in range(12))


def item_stream() -> ItemStream:
    return ItemStream()


def noisy_item_stream() -> ItemStream:
    return ItemStream(noisy=True)


def unsharded_item_stream() -> ItemStream:
    """Every worker reads the whole stream: each item once per worker."""
    return ItemStream(sharded=False)


def plain_items() -> PlainItems:
    return PlainItems()


class ForgetfulStream(ItemStream):
    """Its state always says "at the start": a resume reads the pass over again."""

    def state_dict(self) -> dict:
        return {"position": 0}


def forgetful_stream() -> ForgetfulStream:
    return ForgetfulStream()
