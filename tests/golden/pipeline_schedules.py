# Golden pipeline schedules for tests/unit/parallel/test_pipeline_schedule.cpp, produced by running
# Megatron-Core's own schedule functions (forward_backward_pipelining_without_interleaving and
# _with_interleaving, non-overlapped batch_p2p_comm path) with torch, parallel_state, the p2p calls,
# forward_step and backward_step replaced by recorders. Nothing of Megatron is copied here: the
# functions are read from the schedules.py given on the command line and executed as they are.
#
#   python3 tests/golden/pipeline_schedules.py \
#       <MegaDLMs>/megatron/core/pipeline_parallel/schedules.py > tests/golden/pipeline_schedules_megadlms.inc
#
# Every rank runs alone (the order never depends on tensor values); a receive is then labelled
# with the tensor its peer sent on the same (sender, receiver, activation|gradient) channel, in
# order, and written in megadlm's notation (schedule.h): transfers of one group in megadlm's
# posting order SendNext, SendPrev, RecvPrev, RecvNext (Megatron posts them in another order).
import ast
import collections
import contextlib
import enum
import sys
import types
import typing

NEEDED = {
    'forward_backward_pipelining_with_interleaving', 'forward_backward_pipelining_without_interleaving',
    'recv_forward', 'recv_backward', 'send_forward', 'send_backward', 'send_forward_recv_backward',
    'send_backward_recv_forward', 'get_tensor_shapes', 'check_first_val_step', 'deallocate_output_tensor',
}


class Run:
    """Pipeline position and the trace of the rank being run."""
    pp = rank = 0
    vp = None
    vp_rank = 0
    group_size = 0
    trace = []


class Tokens:
    def __init__(self): self.v = 0
    def cuda(self): return self
    def __iadd__(self, other): self.v += other; return self


class Zero:
    def item(self): return 0


class Module:
    pass


fake_torch = types.SimpleNamespace(int='int', tensor=lambda *a, **k: Tokens(),
                                   nn=types.SimpleNamespace(Module=Module))


class ParallelState:
    @staticmethod
    def get_pipeline_model_parallel_world_size(): return Run.pp
    @staticmethod
    def get_pipeline_model_parallel_rank(): return Run.rank
    @staticmethod
    def set_virtual_pipeline_model_parallel_rank(v): Run.vp_rank = v
    @staticmethod
    def is_pipeline_first_stage(ignore_virtual=False):
        if not ignore_virtual and Run.vp is not None and Run.vp_rank != 0:
            return False
        return Run.rank == 0
    @staticmethod
    def is_pipeline_last_stage(ignore_virtual=False):
        if not ignore_virtual and Run.vp is not None and Run.vp_rank != Run.vp - 1:
            return False
        return Run.rank == Run.pp - 1
    @staticmethod
    def get_context_parallel_world_size(): return 1
    @staticmethod
    def get_tensor_model_parallel_world_size(): return 1


def group(send_next=None, send_prev=None, recv_prev=False, recv_next=False):
    """One batched group, as p2p_communication._communicate posts it (empty: no call)."""
    t = []
    if send_next is not None: t.append(('SendNext', send_next))
    if send_prev is not None: t.append(('SendPrev', send_prev))
    if recv_prev: t.append(('RecvPrev', None))
    if recv_next: t.append(('RecvNext', None))
    if t: Run.trace.append(('C', t))
    return 'received'


class P2P:
    """The p2p_communication entry points, with their first/last-stage no-op rules."""
    @staticmethod
    def recv_forward(shape, config):
        return None if ParallelState.is_pipeline_first_stage() else group(recv_prev=True)
    @staticmethod
    def recv_backward(shape, config):
        return None if ParallelState.is_pipeline_last_stage() else group(recv_next=True)
    @staticmethod
    def send_forward(out, config):
        if not ParallelState.is_pipeline_last_stage(): group(send_next=out)
    @staticmethod
    def send_backward(grad, config):
        if not ParallelState.is_pipeline_first_stage(): group(send_prev=grad)
    @staticmethod
    def send_forward_recv_backward(out, shape, config):
        return None if ParallelState.is_pipeline_last_stage() else group(send_next=out, recv_next=True)
    @staticmethod
    def send_backward_recv_forward(grad, shape, config):
        return None if ParallelState.is_pipeline_first_stage() else group(send_prev=grad, recv_prev=True)
    @staticmethod
    def send_forward_recv_forward(out, recv_prev, tensor_shape, config, overlap_p2p_comm=False):
        return group(send_next=out, recv_prev=recv_prev)
    @staticmethod
    def send_backward_recv_backward(grad, recv_next, tensor_shape, config, overlap_p2p_comm=False):
        return group(send_prev=grad, recv_next=recv_next)
    @staticmethod
    def send_forward_backward_recv_forward_backward(out, grad, recv_prev, recv_next, tensor_shape, config):
        return group(send_next=out, send_prev=grad, recv_prev=recv_prev, recv_next=recv_next), 'received'


class ModelType(enum.Enum):
    encoder_or_decoder = 1
    encoder_and_decoder = 2


def forward_step(forward_step_func, data_iterator, model, num_microbatches, input_tensor, store, config,
                 collect_non_loss_data=False, checkpoint_activations_microbatch=None,
                 is_first_microbatch=False, current_microbatch=None, encoder_decoder_xattn=False):
    label = (current_microbatch, Run.vp_rank if Run.vp is not None else 0)
    Run.trace.append(('F',) + label)
    return (label if not isinstance(input_tensor, list) else [label]), Zero()


def backward_step(input_tensor, output_tensor, output_tensor_grad, model_type, config):
    label = output_tensor if not isinstance(output_tensor, list) else output_tensor[0]
    Run.trace.append(('B',) + label)
    return label if not isinstance(input_tensor, list) else [label]


class Config:
    overlap_p2p_comm = False
    batch_p2p_comm = True
    overlap_p2p_comm_warmup_flush = False
    finalize_model_grads_func = None
    timers = None
    no_sync_func = None
    grad_sync_func = None
    param_sync_func = None
    num_microbatches_with_partial_activation_checkpoints = None
    deallocate_pipeline_outputs = False
    sequence_parallel = False
    hidden_size = 1
    calculate_per_token_loss = False
    variable_seq_lengths = False
    microbatch_group_size_per_vp_stage = 0


def load(path):
    tree = ast.parse(open(path).read())
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in NEEDED]
    missing = NEEDED - {n.name for n in body}
    if missing:
        sys.exit(f'{path}: missing {sorted(missing)}')
    env = dict(torch=fake_torch, contextlib=contextlib, parallel_state=ParallelState, p2p_communication=P2P,
               ModelType=ModelType, forward_step=forward_step, backward_step=backward_step,
               get_model_config=lambda m: Config(), get_model_type=lambda m: ModelType.encoder_or_decoder,
               get_model_xattn=lambda m: False, Iterator=typing.Iterator, List=typing.List,
               Union=typing.Union, Shape=typing.Any)
    exec(compile(ast.Module(body=body, type_ignores=[]), path, 'exec'), env)
    return env


def trace_rank(env, pp, rank, m, v, n, forward_only):
    Run.pp, Run.rank, Run.vp, Run.vp_rank, Run.trace = pp, rank, (v if v > 1 else None), 0, []
    Config.microbatch_group_size_per_vp_stage = n if n else pp
    if v > 1:
        env['forward_backward_pipelining_with_interleaving'](
            forward_step_func=None, data_iterator=[None] * v, model=[Module() for _ in range(v)],
            num_microbatches=m, seq_length=1, micro_batch_size=1, forward_only=forward_only)
    else:
        env['forward_backward_pipelining_without_interleaving'](
            forward_step_func=None, data_iterator=None, model=Module(), num_microbatches=m,
            seq_length=1, micro_batch_size=1, forward_only=forward_only)
    return Run.trace


def notation(traces, pp):
    sent = collections.defaultdict(collections.deque)
    for r, trace in enumerate(traces):
        for a in trace:
            for kind, label in (a[1] if a[0] == 'C' else []):
                if kind == 'SendNext': sent[(r, (r + 1) % pp, 'act')].append(label)
                if kind == 'SendPrev': sent[(r, (r - 1) % pp, 'grad')].append(label)
    token = {'SendNext': 'S>', 'SendPrev': 'S<', 'RecvPrev': 'R<', 'RecvNext': 'R>'}
    order = list(token)
    lists = []
    for r, trace in enumerate(traces):
        items = []
        for a in trace:
            if a[0] != 'C':
                items.append('%s%d.%d' % a)
                continue
            parts = []
            for kind, label in a[1]:
                if kind == 'RecvPrev':  # the last rank's chunk c enters chunk c + 1 of rank 0
                    src = (r - 1) % pp
                    mb, c = sent[(src, r, 'act')].popleft()
                    label = (mb, c + 1 if src == pp - 1 else c)
                elif kind == 'RecvNext':  # rank 0's chunk c gradient enters chunk c - 1 of the last rank
                    src = (r + 1) % pp
                    mb, c = sent[(src, r, 'grad')].popleft()
                    label = (mb, c - 1 if src == 0 else c)
                parts.append((order.index(kind), '%s%d.%d' % (token[kind], label[0], label[1])))
            items.append('[' + ' '.join(p for _, p in sorted(parts)) + ']')
        lists.append(' '.join(items))
    if any(sent.values()):
        sys.exit('a send was never received')
    return lists


def main():
    if len(sys.argv) != 2:
        sys.exit('usage: pipeline_schedules.py <MegaDLMs>/megatron/core/pipeline_parallel/schedules.py')
    env = load(sys.argv[1])
    print('// autogenerated by tests/golden/pipeline_schedules.py from MegaDLMs bdf7545 (Megatron-Core')
    print('// 0.10.0rc0) megatron/core/pipeline_parallel/schedules.py; do not edit.')
    print('// {pp, M, V, N (0 = pp), forward_only, rank, action list}')
    for pp in range(2, 5):
        for v in range(1, 4):
            for m in range(1, 9):
                for n in ([0] if v == 1 else [0] + list(range(pp, m + 1))):
                    nn = n or pp
                    if v > 1 and not (pp <= nn <= m and (m % nn == 0 or m % nn >= pp)):
                        continue  # Megatron raises
                    for forward_only in (0, 1):
                        traces = [trace_rank(env, pp, r, m, v, n, bool(forward_only)) for r in range(pp)]
                        for r, text in enumerate(notation(traces, pp)):
                            print('{%d, %d, %d, %d, %d, %d, "%s"},' % (pp, m, v, n, forward_only, r, text))


if __name__ == '__main__':
    main()
