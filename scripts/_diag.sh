python3 -m pip install --no-build-isolation --no-deps -q -e . > $OUT/build.log 2>&1 || tail -20 $OUT/build.log
so=$(python3 -c "import overlap._C as c; print(c.__file__)")
nm -DC --defined-only $so | head -20
cat > /tmp/t.py <<'PY'
import torch, overlap
from overlap._native import native
C = native()
try:
    C._check_eq_for_test(3, 4)
except Exception as e:
    print("OK1", type(e), e)
import overlap.quantization as q
try:
    q.amax(torch.randn(8, 8).t())
except Exception as e:
    print("OK2", type(e), e)
PY
if python3 -X faulthandler /tmp/t.py; then echo VARIANT-A-OK; else
  echo VARIANT-A-CRASH
  LDFLAGS="-static-libstdc++ -static-libgcc" python3 -m pip install --no-build-isolation --no-deps -q --config-settings=build-dir=build/static -e . > $OUT/build2.log 2>&1 || tail -20 $OUT/build2.log
  python3 -X faulthandler /tmp/t.py && echo VARIANT-B-OK
  cuda-gdb -batch -ex run -ex bt --args python3 /tmp/t.py 2>&1 | tail -12
fi
