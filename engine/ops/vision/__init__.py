"""Detection and image operators: boxes, NMS, anchors, proposals, ROI pooling, resizing,
image transforms, spatial transformers and correlation.

Importing this package registers its operators.
"""

from engine.ops.vision import (  # noqa: F401  (imported for their registrations)
    boxes,
    correlation,
    crop,
    image,
    matching,
    multibox,
    nms,
    proposal,
    psroi,
    resize,
    roi,
    rroi,
    spatial,
)
