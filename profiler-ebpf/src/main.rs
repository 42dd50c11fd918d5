//! stallscope's kernel side: scheduler accounting, off-CPU and on-CPU stacks, block IO and
//! page-cache misses, for the tracked threads only (`maps::TRACKED`).
#![no_std]
#![no_main]

mod block;
mod canary;
mod cuda;
mod dlopen;
mod emit;
mod filemap;
mod maps;
mod oncpu;
mod regs;
mod sched;
mod switch_event;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
