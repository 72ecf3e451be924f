"""ElasticSampler: a distributed sampler that remembers which samples were processed, so an
epoch interrupted by a reset resumes on the remaining samples (Horovod's
``hvd.elastic.ElasticSampler``)."""
import math
import random

import torch.utils.data

from engine_native.torch import runtime as rt


class ElasticSampler(torch.utils.data.Sampler):
    """Partition ``dataset`` over the current ranks, skipping samples already processed.

    Parameters
    ----------
    dataset : Dataset
        Sized dataset to sample from.
    shuffle : bool
        Shuffle indices each epoch (seeded by ``seed + epoch``, the same on every rank).
    seed : int
        Base seed of the shuffle.
    """

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices = set()
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.processed_num = 0
        self.indices = []
        self._padded = []
        self.reset()

    def set_epoch(self, epoch):
        """Start a new epoch: forget processed samples and reshuffle."""
        self.epoch = epoch
        self.processed_indices = set()
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Mark batch ``batch_idx`` as processed on every rank: all ranks step together, so
        each rank records the whole job's samples of that step and a commit on any rank holds
        everything processed so far (a dead rank's committed samples are not lost)."""
        indices = set()
        for r in range(self.num_replicas):
            share = self._padded[r:self.total_size:self.num_replicas]
            indices.update(share[batch_idx * batch_size:(batch_idx + 1) * batch_size])
        self.record_indices(indices)

    def record_indices(self, indices):
        """Mark ``indices`` (dataset indices) as processed (``sync()`` unites every rank's)."""
        self.processed_indices.update(int(i) for i in indices)
        self.processed_num = len(self.processed_indices)

    def get_indices(self, batch_idx, batch_size):
        """Dataset indices of batch ``batch_idx`` of this rank."""
        start = batch_idx * batch_size
        end = min(start + batch_size, len(self.indices))
        return self.indices[start:end]

    def load_state_dict(self, state_dict):
        self.epoch = state_dict['epoch']
        self.processed_indices = set(state_dict['processed_indices'])
        self.processed_num = len(self.processed_indices)
        self.reset()

    def state_dict(self):
        return dict(epoch=self.epoch, processed_indices=sorted(self.processed_indices))

    def reset(self):
        """Re-shard the samples not yet processed this epoch over the current size and rank."""
        initialized = rt.is_initialized()
        self.num_replicas = rt.size() if initialized else 1
        self.rank = rt.rank() if initialized else 0
        remaining = [i for i in range(len(self.dataset)) if i not in self.processed_indices]
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(remaining)
        self.remaining_indices = remaining
        self.num_samples = int(math.ceil(len(remaining) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas
        padded = list(remaining)
        while padded and len(padded) < self.total_size:  # pad so every rank gets as many
            padded += padded[:self.total_size - len(padded)]
        self._padded = padded
        self.indices = padded[self.rank:self.total_size:self.num_replicas]

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
