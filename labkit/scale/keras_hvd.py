"""labkit/scale/keras_single.py made data-parallel with Horovod's Keras API: every rank runs this file
(04_horovod_scaling).

    horovodrun -np 2 -H localhost:2 --gloo python -m labkit.scale.keras_hvd --epochs 1 --steps 20 --batch-size 64

Horovod's own examples/tensorflow2/tensorflow2_keras_mnist.py, applied to the course's network. The legacy SGD:
Horovod 0.28.1's warmup callback corrects the momentum, which Keras 2.11+'s new optimizers keep as a float.
(Horovod's example also passes compile(experimental_run_tf_function=False), which Keras 2.15 ignores.)
"""
import argparse
import os

import horovod.tensorflow.keras as hvd
import tensorflow as tf

from labkit import data, models
from labkit.base import rankstats

p = argparse.ArgumentParser(description="Train small_cnn with model.fit.")
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--steps", type=int, default=50, help="steps per epoch, all workers together")
p.add_argument("--batch-size", type=int, default=64, help="images per worker per step")
p.add_argument("--lr", type=float, default=0.01, help="learning rate of one worker")
p.add_argument("--checkpoint", default="checkpoint-{epoch:02d}.h5", help="weights, a new file each epoch")
p.add_argument("--threads", type=int, default=0, help="CPU threads per worker (0: cores / workers here)")
args = p.parse_args()

hvd.init()  # one process per worker: its rank, and the size of the job
gpus = tf.config.list_physical_devices("GPU")  # one GPU per process, chosen by its rank on this node
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
tf.config.threading.set_intra_op_parallelism_threads(args.threads or max(1, os.cpu_count() // hvd.local_size()))

(x, y), _, info = data.load_dataset()  # CIFAR-10 if it is on disk, else labkit's offline synthetic set
dataset = data.make_dataset(x, y, args.batch_size, shard=(hvd.rank(), hvd.size()), drop_remainder=True).repeat()

model = models.get("small_cnn", input_shape=x.shape[1:])
lr = args.lr * hvd.size()  # linear scaling: the global batch is hvd.size() times larger
opt = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(learning_rate=lr, momentum=0.9))
model.compile(loss="sparse_categorical_crossentropy", optimizer=opt, metrics=["accuracy"])

callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # every rank starts from rank 0's weights
    hvd.callbacks.MetricAverageCallback(),  # loss and accuracy averaged over the ranks, not rank 0's shard
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=1),  # lr / size -> lr in epoch 1
]
if hvd.rank() == 0:  # one writer: the other ranks would overwrite the same file
    callbacks.append(tf.keras.callbacks.ModelCheckpoint(args.checkpoint, save_weights_only=True))
history = model.fit(dataset, steps_per_epoch=max(1, args.steps // hvd.size()), epochs=args.epochs,
                    callbacks=callbacks, verbose=2 if hvd.rank() == 0 else 0)
if hvd.rank() == 0:
    print(f"{info.name}: loss {history.history['loss'][-1]:.3f}, accuracy {history.history['accuracy'][-1]:.3f}")
# the sync proof: every rank prints the checksum of its weights, equal on all ranks when they trained in step
print(f"rank {hvd.rank()}: weights checksum {rankstats.weights_checksum(model.trainable_weights)}")
