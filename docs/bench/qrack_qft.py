"""A state-vector quantum Fourier transform with Qrack (the seed's simulator), dense CPU engine.

usage: qrack_qft.py QUBITS [BASIS]   (pip install pyqrack-cpu; `tierstack bench mem --compare
--dram 48M -- python3 docs/bench/qrack_qft.py 24` times it under run and kernel swap)
Prepares the basis state |BASIS>, applies the QFT and its inverse, and checks that measuring
gives BASIS back. The state vector (8 bytes per amplitude) is one large allocation.
"""
import sys
import time

from pyqrack import Qrack, QrackSimulator

n = int(sys.argv[1])
basis = int(sys.argv[2]) if len(sys.argv) > 2 else (0x5A5A5A5A5A5A & ((1 << n) - 1))
sim = QrackSimulator.__new__(QrackSimulator)
sim.is_pure_stabilizer = False
# A plain dense state vector on the CPU: no tensor network, Schmidt decomposition,
# stabilizer, decision tree, paging, noise, GPU or sparse layers.
sim.sid = Qrack.qrack_lib.init_count_type(n, *([False] * 11))
sim._throw_if_error()
t0 = time.time()
for q in range(n):
    if (basis >> q) & 1:
        sim.x(q)
qs = list(range(n))
sim.qft(qs)
t1 = time.time()
sim.iqft(qs)
t2 = time.time()
got = sim.m_all()
print(f"qubits={n} basis={basis} measured={got}")
print(f"qft_s={t1 - t0:.2f} iqft_s={t2 - t1:.2f}", file=sys.stderr)
sys.exit(0 if got == basis else 1)
