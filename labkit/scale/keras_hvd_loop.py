"""labkit/scale/keras_hvd.py's training as a custom loop: tf.GradientTape -> hvd.DistributedGradientTape
(04_horovod_scaling).

    horovodrun -np 2 -H localhost:2 --gloo python -m labkit.scale.keras_hvd_loop --epochs 1 --steps 20 --batch-size 64

Prefer this form when the step is yours to write: several models or losses (GANs, distillation), gradient
clipping or accumulation, per-step logic that model.fit's callbacks cannot reach; keep model.fit otherwise.
Horovod's own examples/tensorflow2/tensorflow2_mnist.py, applied to the course's network: the broadcast comes
after the first step, once the optimizer has created its variables. labkit.scale.hvd_train is this loop, measured.
"""
import argparse
import os

import horovod.tensorflow as hvd
import tensorflow as tf

from labkit import data, models
from labkit.base import rankstats, training

p = argparse.ArgumentParser(description="Train small_cnn with a custom loop.")
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--steps", type=int, default=50, help="steps per epoch, all workers together")
p.add_argument("--batch-size", type=int, default=64, help="images per worker per step")
p.add_argument("--lr", type=float, default=0.01, help="learning rate of one worker")
p.add_argument("--checkpoint", default="checkpoint.h5", help="weights file written after every epoch")
p.add_argument("--threads", type=int, default=0, help="CPU threads per worker (0: cores / workers here)")
args = p.parse_args()

hvd.init()
gpus = tf.config.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
tf.config.threading.set_intra_op_parallelism_threads(args.threads or max(1, os.cpu_count() // hvd.local_size()))

(x, y), _, info = data.load_dataset()
batches = iter(data.make_dataset(x, y, args.batch_size, shard=(hvd.rank(), hvd.size()), drop_remainder=True).repeat())
steps = max(1, args.steps // hvd.size())

model = models.get("small_cnn", input_shape=x.shape[1:])
lr = training.WarmupLR(args.lr, hvd.size(), warmup_steps=steps)  # args.lr -> args.lr x size over the 1st epoch
opt = tf.keras.optimizers.legacy.SGD(learning_rate=lr, momentum=0.9)
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()


@tf.function
def train_step(images, labels, first_batch):
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(images, training=True))
    tape = hvd.DistributedGradientTape(tape)  # gradient() averages the gradients over all ranks
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    if first_batch:  # after the first step, so that the optimizer's variables exist and are sent too
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables(), root_rank=0)
    return loss


for epoch in range(args.epochs):
    mean_loss = tf.keras.metrics.Mean()
    for step in range(steps):
        mean_loss.update_state(train_step(*next(batches), epoch == 0 and step == 0))
    loss = hvd.allreduce(mean_loss.result())  # the average over the ranks, not rank 0's shard
    if hvd.rank() == 0:  # one writer, one printer
        model.save_weights(args.checkpoint + ".part.h5")  # whole under a temporary name, then renamed:
        os.replace(args.checkpoint + ".part.h5", args.checkpoint)  # a kill mid-write keeps the last checkpoint
        print(f"epoch {epoch + 1}/{args.epochs}: {info.name}, loss {float(loss):.3f}")
# the sync proof: every rank prints the checksum of its weights, equal on all ranks when they trained in step
print(f"rank {hvd.rank()}: weights checksum {rankstats.weights_checksum(model.trainable_weights)}")
