"""labkit/cluster/resume_start.py made resumable: killed part way and run again, it ends with the weights of a run
never stopped (08_training_on_the_cluster).

    horovodrun -np 2 -H localhost:2 --gloo python -m labkit.cluster.resume_hvd --epochs 3 --steps 40

Rank 0 alone writes the checkpoint at the end of every epoch: the weights, the optimizer's state (the momentum
slots and the step counter) and the epoch reached, through tf.train.CheckpointManager, which names the newest
checkpoint in one small file replaced whole (a kill mid-write leaves the previous one). Every rank reads it at
the start, so all of them take the first step from the same state; fit continues at that epoch (and so does the
LR schedule, which follows fit's epoch) and the data skips the batches already trained.
"""
import argparse
import os

import horovod.tensorflow.keras as hvd
import tensorflow as tf

from labkit import data, models

p = argparse.ArgumentParser(description="Train small_cnn on 2 or more Horovod workers; resume where it stopped.")
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--steps", type=int, default=40, help="steps per epoch, all workers together")
p.add_argument("--batch-size", type=int, default=32, help="images per worker per step")
p.add_argument("--lr", type=float, default=0.01, help="learning rate of one worker")
p.add_argument("--checkpoint", default="resume-checkpoint", help="the folder of the run's checkpoint")
args = p.parse_args()

hvd.init()
tf.config.threading.set_intra_op_parallelism_threads(max(1, os.cpu_count() // hvd.size()))

(x, y), _, info = data.load_dataset()  # CIFAR-10 if it is on disk, else labkit's offline synthetic set
steps_per_epoch = max(1, args.steps // hvd.size())
dataset = data.make_dataset(x, y, args.batch_size, shard=(hvd.rank(), hvd.size()), drop_remainder=True).repeat()

model = models.get("small_cnn", input_shape=x.shape[1:])
opt = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(learning_rate=args.lr, momentum=0.9))
model.compile(loss="sparse_categorical_crossentropy", optimizer=opt, metrics=["accuracy"])


def lr_at(epoch):
    """Warmup: one worker's rate in the first epoch, then hvd.size() times it, less by a fifth every epoch."""
    return args.lr if epoch == 0 else args.lr * hvd.size() * 0.8 ** (epoch - 1)


epoch = tf.Variable(0, dtype=tf.int64)  # the epochs finished, kept in the checkpoint
checkpoint = tf.train.Checkpoint(model=model, optimizer=opt, epoch=epoch)
manager = tf.train.CheckpointManager(checkpoint, args.checkpoint, max_to_keep=1)
if manager.latest_checkpoint:  # every rank reads it: the same weights and momentum on all of them
    checkpoint.restore(manager.latest_checkpoint)  # the optimizer's slots are filled when it creates them
start = int(epoch)
dataset = dataset.skip(start * steps_per_epoch)  # the same shuffled order as before, past the batches trained


class SaveEveryEpoch(tf.keras.callbacks.Callback):
    def on_epoch_end(self, e, logs=None):
        epoch.assign(e + 1)
        if hvd.rank() == 0:  # one writer: every rank holds the same state
            manager.save()


callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # every rank starts from rank 0's weights
    hvd.callbacks.MetricAverageCallback(),
    tf.keras.callbacks.LearningRateScheduler(lr_at),  # sets the rate at the start of each epoch of fit
    SaveEveryEpoch(),
]
model.fit(dataset, steps_per_epoch=steps_per_epoch, epochs=args.epochs, initial_epoch=start, callbacks=callbacks,
          verbose=2 if hvd.rank() == 0 else 0)
