"""Which device an FX graph compiles for, and the constants that go there with it.

A graph on one CUDA device may hold some CPU tensors (a CPU input, a CPU factory op, a copy to
the GPU): it is a CUDA graph whose nodes that read or make a CPU tensor run in eager PyTorch
(support.node_support refuses them) and which is not replayed as a CUDA graph
(cudagraphs.why_not)."""
import torch

from braze import cuda as cuda_support


def tensor_devices(node):
    """The devices of the tensors in FX node `node`'s meta value (several for a tuple)."""
    return [v.device for v in torch.utils._pytree.tree_leaves(node.meta.get("val"))
            if isinstance(v, torch.Tensor)]


def graph_device(gm, example_inputs):
    """(device, None) for a graph braze can compile: None for the CPU, a torch.device for CUDA;
    (None, reason) when it cannot. Outputs count too (a graph of factory ops has no inputs)."""
    devices = {a.device for a in example_inputs if isinstance(a, torch.Tensor)}
    for node in gm.graph.nodes:
        if node.op == "output":
            for o in torch.utils._pytree.tree_leaves(node.args[0]):
                if isinstance(o, torch.fx.Node):
                    devices.update(tensor_devices(o))
    cuda = [d for d in devices if d.type == "cuda"]
    others = [d for d in devices if d.type not in ("cpu", "cuda")]
    if others:
        return None, f"graph on {others[0]}: braze compiles CPU and CUDA graphs"
    if not cuda:
        return None, None
    if len({(d.type, d.index if d.index is not None else torch.cuda.current_device())
            for d in cuda}) > 1:
        return None, f"graph mixes CUDA devices {sorted(map(str, cuda))}"
    why = cuda_support.unavailable_reason(cuda[0])
    if why:
        return None, f"graph on {cuda[0]}: {why}"
    dev = cuda[0]
    return torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device()), None


def constants_to_device(gm, device):
    """Moves the tensors graph `gm` holds as attributes onto the graph's `device`, with the
    meta values of their get_attr nodes and of the fresh copies Dynamo makes of them: a constant
    that Dynamo made on the CPU (an index tensor built in the user's function) goes with the
    graph, as eager's CUDA ops take a CPU index. One that a CPU op reads, or that the graph
    returns, stays. Returns how many moved."""
    moved = 0
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        *path, name = node.target.split(".")
        owner = gm
        for part in path:
            owner = getattr(owner, part)
        value = getattr(owner, name)
        if not isinstance(value, torch.Tensor) or value.device == device:
            continue
        if not _read_on(node, device):
            continue
        # A real copy, also while AOTAutograd's fake mode is active around the compiler.
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        with unset_fake_temporarily():
            on_device = value.to(device)
            if isinstance(value, torch.nn.Parameter):
                on_device = torch.nn.Parameter(on_device, requires_grad=value.requires_grad)
        setattr(owner, name, on_device)
        node.meta["val"] = on_device
        for user in node.users:
            if user.target is torch.ops.aten.lift_fresh_copy.default:
                user.meta["val"] = on_device
        moved += 1
    return moved


def scalars_to_device(gm, example_inputs, written=()):
    """For a graph on one CUDA device, the 0-d CPU tensor arguments that only ops on the device
    read (a cache length kept on the CPU and copied to the GPU in the graph, a CPU scalar in a
    CUDA op): their placeholders become device tensors, as eager's CUDA ops read a CPU scalar.
    Arguments the graph writes (`written` positions), or returns, stay. Returns the example
    inputs with those moved, and a wrapper that makes a boxed callable move them per call
    (None when none moved)."""
    device, _ = graph_device(gm, example_inputs)
    if device is None:
        return example_inputs, None
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    moved = []
    for i, (node, val) in enumerate(zip(placeholders, example_inputs)):
        if (i in written or not isinstance(val, torch.Tensor) or val.device.type != "cpu"
                or val.dim() != 0 or not node.users or not _read_on(node, device)):
            continue
        node.meta["val"] = val.to(device)
        moved.append(i)
    if not moved:
        return example_inputs, None

    def moving(boxed):
        def call(args):
            for i in moved:
                args[i] = args[i].to(device, non_blocking=True)
            return boxed(args)
        call._boxed_call = True
        return call
    return [a.to(device) if i in moved else a for i, a in enumerate(example_inputs)], moving


def _read_on(node, device):
    """Whether every node that reads `node` (through the copies Dynamo makes of a constant)
    computes on `device`: its results are there, or it has none. A graph output is returned
    where it is."""
    for user in node.users:
        if user.op == "output":
            return False
        if user.target is torch.ops.aten.lift_fresh_copy.default:
            if not _read_on(user, device):
                return False
            continue
        if any(d != device for d in tensor_devices(user)):
            return False
    return True
