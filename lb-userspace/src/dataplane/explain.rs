//! `lbctl explain`: a dry run of the loaded (and, in lbd, attached) `lb_xdp` on one frame
//! (BPF_PROG_TEST_RUN with XDP metadata, see `lb_common::explain`).

use std::io::Read;

use anyhow::{Context, Result, anyhow, bail};
use aya::{
    Ebpf,
    maps::{Array, MapData, ProgramArray},
    programs::{TestRun, TestRunOptions, Xdp},
};
use lb_common::{
    explain::{ExplainRecord, META_LEN, NOTED_MAP, NOTED_PROGRAM, TOKEN_MAP, step},
    maps,
};

use super::Dataplane;

fn token_map(ebpf: &mut Ebpf) -> Result<Array<&mut MapData, u64>> {
    let m = ebpf
        .map_mut(TOKEN_MAP)
        .ok_or_else(|| anyhow!("map {TOKEN_MAP} missing from the object"))?;
    Array::try_from(m).with_context(|| format!("map {TOKEN_MAP}"))
}

/// Give the program a fresh random token (never 0): only a run carrying it is a dry run.
pub(super) fn arm_token(ebpf: &mut Ebpf) -> Result<()> {
    let mut b = [0u8; 8];
    let mut token = 0;
    while token == 0 {
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut b))
            .context("read /dev/urandom")?;
        token = u64::from_ne_bytes(b);
    }
    token_map(ebpf)?.set(0, token, 0)?;
    Ok(())
}

/// Where `lb_xdp_noted` stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Noted {
    /// Not loaded: `LB_NOTED` is empty.
    Unloaded,
    /// Loaded and in `LB_NOTED`.
    Armed,
    /// Taken out of `LB_NOTED` on purpose ([`Dataplane::empty_noted_slot`]), never put back.
    Emptied,
}

/// What a dry run answered: the verdict, the trail, and the output frame (metadata first).
pub struct DryRun {
    pub verdict: u32,
    pub record: ExplainRecord,
    pub out: Vec<u8>,
}

impl Dataplane {
    /// Load the path that notes (`lb_xdp_noted`, the second copy of the path, which `lb_xdp`
    /// tail-calls for a frame with metadata or a traced packet) and put it in `LB_NOTED`, once:
    /// a dry run and a trace need it, forwarding never does, and it doubles what the verifier
    /// does at a load. The map stays in the object: the kernel empties a program array when user
    /// space's last descriptor of it closes. Until then a traced packet takes the ordinary path
    /// untraced, and a frame with metadata is passed untouched.
    pub fn arm_noted(&mut self) -> Result<()> {
        if self.noted != Noted::Unloaded {
            return Ok(());
        }
        super::load_xdp(&mut self.ebpf, NOTED_PROGRAM)?;
        let prog: &Xdp = self
            .ebpf
            .program(NOTED_PROGRAM)
            .ok_or_else(|| anyhow!("program {NOTED_PROGRAM} missing"))?
            .try_into()?;
        let fd = prog.fd()?.try_clone()?;
        let m = self
            .ebpf
            .map_mut(NOTED_MAP)
            .ok_or_else(|| anyhow!("map {NOTED_MAP} missing from the object"))?;
        ProgramArray::try_from(m)
            .with_context(|| format!("map {NOTED_MAP}"))?
            .set(0, &fd, 0)
            .with_context(|| format!("set {NOTED_MAP}"))?;
        self.noted = Noted::Armed;
        Ok(())
    }

    /// Empty `LB_NOTED`'s slot for good, as in a program no lbd armed: for tests of what
    /// `lb_xdp` does when its tail call to the noted path fails.
    pub fn empty_noted_slot(&mut self) -> Result<()> {
        if self.noted == Noted::Armed {
            let m = self
                .ebpf
                .map_mut(NOTED_MAP)
                .ok_or_else(|| anyhow!("map {NOTED_MAP} missing from the object"))?;
            ProgramArray::try_from(m)?
                .clear_index(&0)
                .with_context(|| format!("clear {NOTED_MAP}"))?;
        }
        self.noted = Noted::Emptied;
        Ok(())
    }

    /// The program's token, for [`crate::explain::frame`].
    pub fn explain_token(&mut self) -> Result<u64> {
        Ok(token_map(&mut self.ebpf)?.get(&0, 0)?)
    }

    /// Run `lb_xdp` in dry mode on `input` (the metadata with the token, then the frame): it
    /// decides as for a packet of the flow and writes no map the data plane reads.
    pub fn explain(&mut self, input: &[u8]) -> Result<DryRun> {
        if input.len() < META_LEN + 14 {
            bail!("explain frame too short");
        }
        self.arm_noted()
            .context("load the noted path for dry runs")?;
        let prog: &mut Xdp = self
            .ebpf
            .program_mut(maps::PROGRAM)
            .ok_or_else(|| anyhow!("no program {}", maps::PROGRAM))?
            .try_into()?;
        // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index,
        // egress_ifindex. `data` past 0 makes the kernel take that many input bytes as metadata.
        let md: [u32; 6] = [META_LEN as u32, input.len() as u32, 0, 0, 0, 0];
        let ctx: Vec<u8> = md.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let mut ctx_out = vec![0u8; ctx.len()];
        // Room for an outer header (a routed backend) or an ICMP answer.
        let mut out = vec![0u8; input.len() + 256];
        let opts = TestRunOptions {
            data_in: Some(input),
            data_out: Some(&mut out),
            ctx_in: Some(&ctx),
            ctx_out: Some(&mut ctx_out),
            ..TestRunOptions::new()
        };
        let r = prog.test_run(opts).context("BPF_PROG_TEST_RUN of lb_xdp")?;
        out.truncate(r.data_size_out as usize);
        let record = ExplainRecord::from_bytes(&out)
            .ok_or_else(|| anyhow!("the dry run returned no metadata"))?;
        // Without the DRY step the program did not take the run for a dry one (a stale token):
        // it may have written as for a real packet, and its answer is not a trail.
        if record.steps & step::DRY == 0 {
            bail!("the XDP program did not run in dry mode (token mismatch)");
        }
        Ok(DryRun {
            verdict: r.return_value,
            record,
            out,
        })
    }
}
