"""A Keras training script for one process: data, model, compile, fit, a checkpoint (04_horovod_scaling).

    python -m labkit.scale.keras_single --epochs 1 --steps 20 --batch-size 64

The starting point of 04's Horovod exercise; labkit/scale/keras_hvd.py is this script made data-parallel.
"""
import argparse

import tensorflow as tf

from labkit import data, models

p = argparse.ArgumentParser(description="Train small_cnn with model.fit.")
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--steps", type=int, default=50, help="steps per epoch, all workers together")
p.add_argument("--batch-size", type=int, default=64, help="images per worker per step")
p.add_argument("--lr", type=float, default=0.01, help="learning rate of one worker")
p.add_argument("--checkpoint", default="checkpoint-{epoch:02d}.h5", help="weights, a new file each epoch")
args = p.parse_args()

(x, y), _, info = data.load_dataset()  # CIFAR-10 if it is on disk, else labkit's offline synthetic set
dataset = data.make_dataset(x, y, args.batch_size, drop_remainder=True).repeat()

model = models.get("small_cnn", input_shape=x.shape[1:])
opt = tf.keras.optimizers.legacy.SGD(learning_rate=args.lr, momentum=0.9)
model.compile(loss="sparse_categorical_crossentropy", optimizer=opt, metrics=["accuracy"])

callbacks = [tf.keras.callbacks.ModelCheckpoint(args.checkpoint, save_weights_only=True)]
history = model.fit(dataset, steps_per_epoch=args.steps, epochs=args.epochs, callbacks=callbacks, verbose=2)
print(f"{info.name}: loss {history.history['loss'][-1]:.3f}, accuracy {history.history['accuracy'][-1]:.3f}")
