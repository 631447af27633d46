"""The Keras 3 backend (TensorFlow, tf.distribute.MirroredStrategy), fed by DALI's TensorFlow plugin."""
