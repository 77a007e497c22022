import torch
from _common import ConvNet, ensure_weights, image_tensor
from fastapi import FastAPI

model = ConvNet()
model.load_state_dict(torch.load(ensure_weights(), map_location="cpu"))
model.eval()
app = FastAPI()


@app.post("/predict")
def predict(payload: dict):
    x = image_tensor(payload["image"])
    with torch.inference_mode():
        probs = model(x).softmax(-1)[0]
    top = probs.topk(5)
    return {"classes": top.indices.tolist(), "scores": top.values.tolist()}
