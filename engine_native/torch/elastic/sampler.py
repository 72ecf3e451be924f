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
        self.reset()

    def set_epoch(self, epoch):
        """Start a new epoch: forget processed samples and reshuffle."""
        self.epoch = epoch
        self.processed_indices = set()
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Mark the samples of batch ``batch_idx`` of this rank as processed."""
        indices = set(self.get_indices(batch_idx, batch_size))
        self.record_indices(indices)

    def record_indices(self, indices):
        """Mark ``indices`` (dataset indices) as processed."""
        self.processed_indices.update(indices)
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
        """Recompute this rank's share for the current size and rank."""
        initialized = rt.is_initialized()
        self.num_replicas = rt.size() if initialized else 1
        self.rank = rt.rank() if initialized else 0
        self.remaining_indices = [i for i in range(len(self.dataset))
                                  if i not in self.processed_indices]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        indices = list(self.remaining_indices)
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        while indices and len(indices) < self.total_size:  # pad so every rank gets as many
            indices += indices[:self.total_size - len(indices)]
        self.indices = indices[self.rank:self.total_size:self.num_replicas]
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
