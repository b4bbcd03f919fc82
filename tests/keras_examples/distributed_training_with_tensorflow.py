"""An MNIST classifier trained on every local GPU with `tf.distribute.MirroredStrategy`, with
checkpoints, a CSV log of every epoch and a learning-rate schedule; restored from its last
checkpoint, evaluated, then trained one more round.

A script in the shape of keras.io's "Multi-GPU distributed training with TensorFlow" (a
MirroredStrategy, the model built and compiled in its scope, `tf.data` from arrays,
checkpoints, a restore), written for tfgpu's tests: tests/test_keras_examples.py runs it under
`tfgpu run` with small stand-in data.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras
import tensorflow as tf

CHECKPOINTS = "checkpoints"
PER_REPLICA_BATCH = 64
EPOCHS = 6

strategy = tf.distribute.MirroredStrategy()
replicas = strategy.num_replicas_in_sync
print(f"MirroredStrategy over {replicas} replica(s)")
batch = PER_REPLICA_BATCH * replicas

(x_train, y_train), (x_test, y_test) = keras.datasets.mnist.load_data()
x_train = x_train.reshape(len(x_train), -1).astype("float32") / 255.0
x_test = x_test.reshape(len(x_test), -1).astype("float32") / 255.0

# The last batch of an epoch is usually short: the data rarely divides by the batch.
train_ds = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(4096).batch(batch)
test_ds = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(batch)
print(f"{len(x_train)} training examples in batches of {batch}")


def new_classifier():
    model = keras.Sequential(
        [
            keras.Input(shape=(x_train.shape[1],)),
            keras.layers.Dense(192, activation="relu"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(96, activation="relu"),
            keras.layers.Dense(10),
        ],
        name="mlp",
    )
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=0.05, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def learning_rate_for(epoch, rate):
    # Hold the first two epochs, then shrink by a third each epoch.
    return rate if epoch < 2 else rate * 2 / 3


class ShowLearningRate(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        rate = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
        print(f"\nlearning rate after epoch {epoch + 1}: {rate:.5f}")


def training_callbacks():
    return [
        keras.callbacks.CSVLogger("history.csv", append=True),  # one row per epoch, both fits
        keras.callbacks.ModelCheckpoint(os.path.join(CHECKPOINTS, "epoch-{epoch:02d}.keras")),
        keras.callbacks.LearningRateScheduler(learning_rate_for),
        ShowLearningRate(),
    ]


def newest_checkpoint():
    # The epoch number is zero-padded in the name, so the names sort by epoch.
    return os.path.join(CHECKPOINTS, max(os.listdir(CHECKPOINTS)))


os.makedirs(CHECKPOINTS, exist_ok=True)
print("building the model in the strategy's scope")
with strategy.scope():  # variables made here are mirrored on every replica
    model = new_classifier()
model.fit(train_ds, epochs=EPOCHS, validation_data=test_ds, callbacks=training_callbacks())

# As after a restart: load the newest checkpoint in the strategy's scope and go on from it.
latest = newest_checkpoint()
print(f"restoring {latest}")
with strategy.scope():
    restored = keras.models.load_model(latest)
loss, accuracy = restored.evaluate(test_ds, verbose=2)
print(f"restored model: test accuracy {accuracy:.4f}")
restored.fit(train_ds, epochs=1, validation_data=test_ds, callbacks=training_callbacks(), verbose=2)
