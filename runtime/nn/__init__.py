"""Neural-network building blocks: ``Cell``, layers, containers, losses, optimizers, initializers."""
from . import init
from .cell import Cell
from .container import CellList, SequentialCell
from .layers import GELU, Dense, Dropout, Flatten, ReLU, Sigmoid, Softmax, Tanh, get_activation
from .loss import CrossEntropyLoss, L1Loss, LossBase, MSELoss, SoftmaxCrossEntropyWithLogits
from .optim import SGD, Adam, AdamWeightDecay, Momentum, Optimizer
from .wrap import ParameterTuple, TrainOneStepCell, WithLossCell

__all__ = ["Cell", "init", "SequentialCell", "CellList", "Dense", "ReLU", "Tanh", "Sigmoid", "GELU", "Softmax",
           "Flatten", "Dropout", "get_activation", "LossBase", "MSELoss", "L1Loss", "CrossEntropyLoss",
           "SoftmaxCrossEntropyWithLogits", "Optimizer", "SGD", "Momentum", "Adam", "AdamWeightDecay",
           "ParameterTuple", "WithLossCell", "TrainOneStepCell"]
