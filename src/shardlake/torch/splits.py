"""A train/valid pair of datasets over one version, their selections checked disjoint."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..root.door import StoreLike, as_store
from .dataset import ShardDataset

__all__ = ["train_valid"]


def train_valid(
    url: StoreLike,
    version: str = "latest",
    *,
    batch_size: int,
    valid_keyset: str | None = None,
    valid_where: str | None = None,
    valid_keys: Sequence[str] | None = None,
    train_keyset: str | None = None,
    train_where: str | None = None,
    valid_batch_size: int | None = None,
    **options: Any,
) -> tuple[ShardDataset, ShardDataset]:
    """A (train, valid) pair of datasets over one version.

    The validation set is given by ``valid_keyset``/``valid_where``/``valid_keys`` and is not
    shuffled; the training set is ``train_keyset``/``train_where`` or else everything else.
    The two are checked to be disjoint and to resolve the same version. ``url`` is a
    :data:`~shardlake.StoreLike` opened once through :func:`shardlake.as_store` (with
    ``storage_options`` among ``options``, for a URL only); both datasets read that store.
    """
    store = as_store(url, options.pop("storage_options", None), name="train_valid(url)")
    valid = ShardDataset(
        store,
        version,
        batch_size=valid_batch_size or batch_size,
        keyset=valid_keyset,
        where=valid_where,
        keys=valid_keys,
        shuffle=False,
        **options,
    )
    from ..query.dataset import Dataset
    from ..query.selection import require_disjoint

    version_ds = Dataset.open(store, valid.version_tag)
    valid_sel = version_ds.select(keyset=valid_keyset, where=valid_where, keys=valid_keys)
    train_sel = version_ds.select(keyset=train_keyset, where=train_where)
    if train_keyset is None and train_where is None:
        train_sel = valid_sel.complement()
    require_disjoint(train_sel, valid_sel, "train and valid selections")
    chosen: dict[str, Any] = {} if train_sel.keys is None else {"keys": train_sel.keys}
    train = ShardDataset(
        store,
        valid.version_tag,
        batch_size=batch_size,
        keyset=train_keyset,
        where=train_where,
        **chosen,
        **options,
    )
    return train, valid
