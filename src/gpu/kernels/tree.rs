//! Postfix programs of the pairwise tree, as the device's tree fold
//! (`fold.cu`, mode 2) evaluates them: a slot index pushes that slot's
//! value, [`TREE_ADD`] pops right then left and pushes left + right.

/// Deepest operand stack the device tree evaluator holds (emitted as
/// `FP_STACK`).
pub const TREE_STACK: usize = 40;
/// The postfix "add" opcode (emitted as `FP_ADD_OP`).
pub const TREE_ADD: u32 = u32::MAX;

/// Postfix program of `fold::fold_pairwise` over slots `0..k`: first half
/// `ceil(k/2)`, then the rest, then add.
pub fn tree_program(k: usize) -> Vec<u32> {
    fn emit(lo: usize, k: usize, out: &mut Vec<u32>) {
        if k == 1 {
            out.push(lo as u32);
        } else {
            let mid = k.div_ceil(2);
            emit(lo, mid, out);
            emit(lo + mid, k - mid, out);
            out.push(TREE_ADD);
        }
    }
    let mut out = Vec::with_capacity(2 * k);
    if k > 0 {
        emit(0, k, &mut out);
    }
    out
}

/// Deepest stack a postfix program reaches.
pub fn program_depth(prog: &[u32]) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    for &op in prog {
        if op == TREE_ADD {
            depth = depth.saturating_sub(1);
        } else {
            depth += 1;
            max = max.max(depth);
        }
    }
    max
}

/// The fold mode and device program of `contract` at world `w`, with the
/// delivery `order` (used by arrival-order only); `Err` says why the
/// device cannot fold it.
pub fn fold_program(
    contract: crate::fold::Contract,
    w: usize,
    order: &[usize],
) -> Result<(super::FoldMode, Vec<u32>), &'static str> {
    use super::FoldMode;
    use crate::fold::Contract;
    Ok(match contract {
        Contract::FixedOrder => (FoldMode::Fixed, Vec::new()),
        Contract::ArrivalOrder => (FoldMode::Order, order.iter().map(|&r| r as u32).collect()),
        Contract::NcclAllreduce => return Err("nccl-allreduce needs the NCCL backend"),
        Contract::PairwiseTree => {
            let prog = tree_program(w);
            if program_depth(&prog) > TREE_STACK {
                return Err("pairwise tree deeper than the device stack");
            }
            (FoldMode::Tree, prog)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fold::fold_pairwise;

    /// Evaluate a postfix program on the host the way the kernel does.
    fn run_program(prog: &[u32], slots: &[f32]) -> f32 {
        let mut st = Vec::new();
        for &op in prog {
            if op == TREE_ADD {
                let r: f32 = st.pop().unwrap();
                let l: f32 = st.pop().unwrap();
                st.push(l + r);
            } else {
                st.push(slots[op as usize]);
            }
        }
        st[0]
    }

    #[test]
    fn tree_program_matches_fold_pairwise() {
        for k in 1..=70usize {
            let slots: Vec<f32> = (0..k)
                .map(|i| {
                    crate::data::value(crate::data::Distribution::MixedMagnitude, 3, i as u32, 0, 7)
                })
                .collect();
            let prog = tree_program(k);
            assert_eq!(prog.len(), 2 * k - 1);
            assert_eq!(
                run_program(&prog, &slots).to_bits(),
                fold_pairwise(&slots).to_bits(),
                "k={k}"
            );
        }
        // W up to the schema's cap fits the device stack.
        assert!(program_depth(&tree_program(65_536)) <= TREE_STACK);
    }
}
